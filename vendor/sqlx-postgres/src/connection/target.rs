//! A new connection walks the hosts of the options in order and keeps the first that
//! connects and matches `target_session_attrs`, as libpq does (not in sqlx 0.9.0).
use std::fmt::Write;

use sqlx_core::executor::Executor;
use sqlx_core::raw_sql::raw_sql;
use sqlx_core::row::Row;
use sqlx_core::sql_str::AssertSqlSafe;

use crate::error::Error;
use crate::{PgConnectOptions, PgConnection, PgTargetSessionAttrs};

/// Why one host was passed over.
enum Passed {
    /// Worth trying again later (refused, timed out, starting up, not the target yet).
    Retryable(String),
    /// Nothing will change by waiting (authentication, a bad database name…).
    Final(Error),
}

impl PgConnection {
    pub(crate) async fn connect_target(options: &PgConnectOptions) -> Result<Self, Error> {
        // One host, any server, no timeout of its own: as sqlx connects without a list.
        if options.hosts.is_empty()
            && options.target_session_attrs == PgTargetSessionAttrs::Any
            && options.connect_timeout.is_none()
        {
            return Self::establish(options).await;
        }
        let mut passed_over = String::new();
        let mut final_error = None;
        for (host, port) in options.get_hosts() {
            let mut one = options.clone();
            one.hosts = Vec::new();
            one.host = host.to_owned();
            one.port = port;
            let attempt = Self::establish_matching(&one);
            let outcome = match options.connect_timeout {
                Some(limit) => match sqlx_core::rt::timeout(limit, attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(Passed::Retryable(format!(
                        "no answer within connect_timeout ({} ms)",
                        limit.as_millis()
                    ))),
                },
                None => attempt.await,
            };
            let why = match outcome {
                Ok(conn) => return Ok(conn),
                Err(Passed::Retryable(why)) => why,
                Err(Passed::Final(err)) => {
                    let why = err.to_string();
                    final_error.get_or_insert(err);
                    why
                }
            };
            let _ = write!(
                passed_over,
                "{}{host}:{port}: {why}",
                if passed_over.is_empty() { "" } else { "; " }
            );
        }
        if let Some(err) = final_error {
            return Err(err);
        }
        // Refused: the pool tries again until its acquire timeout, as it does when the one
        // server refuses while it starts; a failover is a server starting.
        Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!(
                "no host is a server for target_session_attrs={}: {passed_over}",
                options.target_session_attrs
            ),
        )))
    }

    async fn establish_matching(options: &PgConnectOptions) -> Result<Self, Passed> {
        let mut conn = Self::establish(options).await.map_err(|err| match &err {
            Error::Io(_) | Error::Tls(_) | Error::PoolTimedOut => {
                Passed::Retryable(err.to_string())
            }
            Error::Database(db) if db.is_transient_in_connect_phase() => {
                Passed::Retryable(err.to_string())
            }
            _ => Passed::Final(err),
        })?;
        let (query, wrong) = match options.target_session_attrs {
            PgTargetSessionAttrs::Any => return Ok(conn),
            PgTargetSessionAttrs::ReadWrite => {
                ("SHOW transaction_read_only", "its sessions are read-only")
            }
            PgTargetSessionAttrs::Primary => (
                "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN 'on' ELSE 'off' END",
                "it is in recovery (a standby)",
            ),
        };
        let answer = match conn.fetch_one(raw_sql(AssertSqlSafe(query))).await {
            Ok(row) => row.try_get::<String, _>(0),
            Err(err) => Err(err),
        };
        match answer.as_deref() {
            Ok("off") => Ok(conn),
            Ok(_) => {
                let _ = sqlx_core::connection::Connection::close(conn).await;
                Err(Passed::Retryable(wrong.to_owned()))
            }
            Err(err) => Err(Passed::Retryable(format!(
                "cannot ask whether {wrong}: {err}"
            ))),
        }
    }
}
