//! [`StoreError`]: a database failure met while serving, and whether the statement
//! provably never reached the database.
use std::sync::Arc;

/// A database failure met while serving a request. Cloneable: one failed group commit
/// fails every charge in it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection could be had: the statement was never sent. Worth a retry.
    #[error("cannot reach the database: {0}")]
    Unreachable(#[source] Arc<sqlx::Error>),
    /// The connection failed under the statement, or the database asked us to try again:
    /// the statement may or may not have taken effect. Worth a retry.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] Arc<sqlx::Error>),
    #[error("database error: {0}")]
    Other(#[source] Arc<sqlx::Error>),
    #[error("unexpected data in the database: {0}")]
    Corrupt(String),
}

impl StoreError {
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unreachable(_) | StoreError::Unavailable(_)
        )
    }

    /// True when the statement cannot have reached the database: no connection was had.
    pub fn never_sent(&self) -> bool {
        matches!(self, StoreError::Unreachable(_))
    }

    /// For a failure to get a connection from the pool.
    pub fn unreachable(err: sqlx::Error) -> StoreError {
        StoreError::Unreachable(Arc::new(err))
    }

    /// For a failure of a statement SQLite's writer ran on its own connection
    /// (`db::Batch::run`): told apart as sqlx's would be, by SQLite's extended result code
    /// (BUSY and LOCKED are worth a retry).
    pub fn sqlite(err: rusqlite::Error) -> StoreError {
        let sqlx_error = match err {
            rusqlite::Error::SqliteFailure(failure, message) => {
                sqlx::Error::Database(Box::new(SqliteFailure {
                    code: failure.extended_code,
                    message: message.unwrap_or_else(|| failure.to_string()),
                }))
            }
            other => sqlx::Error::Decode(Box::new(other)),
        };
        StoreError::from(sqlx_error)
    }
}

/// A statement's failure as SQLite reported it to the writer's own calls.
#[derive(Debug, thiserror::Error)]
#[error("(code: {code}) {message}")]
struct SqliteFailure {
    code: i32,
    message: String,
}

impl sqlx::error::DatabaseError for SqliteFailure {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &err
            && db.code().as_deref() == Some(READ_ONLY)
        {
            super::read_only::seen();
        }
        if is_transient(&err) {
            StoreError::Unavailable(Arc::new(err))
        } else {
            StoreError::Other(Arc::new(err))
        }
    }
}

/// SQLSTATE read_only_sql_transaction.
const READ_ONLY: &str = "25006";

fn is_transient(err: &sqlx::Error) -> bool {
    use sqlx::Error::*;
    match err {
        Io(_) | Tls(_) | PoolTimedOut | PoolClosed | WorkerCrashed | Protocol(_) => true,
        Database(db) => db.code().is_some_and(|code| {
            // Postgres: connection exceptions (08…), operator intervention such as
            // admin_shutdown (57P…), too_many_connections, serialization failure, deadlock,
            // and read_only_sql_transaction (25006): the server became a standby or
            // read-only under a connection kept for writing, a lost database like the
            // others; a new connection walks DATABASE_URL's hosts to the writable server.
            // Every connection opened before it is let go (`db::read_only`).
            // SQLite: BUSY and LOCKED and their extended codes.
            code.starts_with("08")
                || code.starts_with("57P")
                || matches!(
                    code.as_ref(),
                    "53300"
                        | "40001"
                        | "40P01"
                        | READ_ONLY
                        | "5"
                        | "6"
                        | "261"
                        | "517"
                        | "773"
                        | "262"
                )
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(extended_code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(extended_code), None)
    }

    /// A statement SQLite's writer ran itself fails as one sqlx ran would: BUSY and
    /// LOCKED (and their extended codes) are worth a retry, a constraint is not.
    #[test]
    fn the_writers_own_sqlite_failures_are_told_apart_by_their_extended_code() {
        for code in [5, 6, 261, 517, 262] {
            let err = StoreError::sqlite(failure(code));
            assert!(err.is_transient(), "{code}: {err}");
            assert!(
                !err.never_sent(),
                "{code}: a statement that failed was sent"
            );
        }
        // SQLITE_CONSTRAINT_CHECK, SQLITE_CONSTRAINT_UNIQUE, SQLITE_ERROR.
        for code in [275, 2067, 1] {
            let err = StoreError::sqlite(failure(code));
            assert!(!err.is_transient(), "{code}: {err}");
        }
        let decoding = StoreError::sqlite(rusqlite::Error::InvalidColumnIndex(3));
        assert!(!decoding.is_transient(), "{decoding}");
    }

    /// Postgres's SQLSTATE, as a server sends it.
    #[derive(Debug, thiserror::Error)]
    #[error("({0}) refused")]
    struct PgCode(&'static str);

    impl sqlx::error::DatabaseError for PgCode {
        fn message(&self) -> &str {
            "refused"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    /// A statement a server refused because it became read-only (a demoted primary, a
    /// standby) is a lost database, worth a retry on the next connection; a constraint is
    /// not.
    // Seen failing without "25006" in the list: Other, not transient.
    #[test]
    fn a_server_that_became_read_only_is_a_lost_database() {
        let read_only = StoreError::from(sqlx::Error::Database(Box::new(PgCode("25006"))));
        assert!(
            matches!(read_only, StoreError::Unavailable(_)),
            "{read_only:?}"
        );
        let unique = StoreError::from(sqlx::Error::Database(Box::new(PgCode("23505"))));
        assert!(matches!(unique, StoreError::Other(_)), "{unique:?}");
    }
}
