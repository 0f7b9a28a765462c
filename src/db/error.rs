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
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        if is_transient(&err) {
            StoreError::Unavailable(Arc::new(err))
        } else {
            StoreError::Other(Arc::new(err))
        }
    }
}

fn is_transient(err: &sqlx::Error) -> bool {
    use sqlx::Error::*;
    match err {
        Io(_) | Tls(_) | PoolTimedOut | PoolClosed | WorkerCrashed | Protocol(_) => true,
        Database(db) => db.code().is_some_and(|code| {
            // Postgres: connection exceptions (08…), operator intervention such as
            // admin_shutdown (57P…), too_many_connections, serialization failure, deadlock.
            // SQLite: BUSY and LOCKED and their extended codes.
            code.starts_with("08")
                || code.starts_with("57P")
                || matches!(
                    code.as_ref(),
                    "53300" | "40001" | "40P01" | "5" | "6" | "261" | "517" | "773" | "262"
                )
        }),
        _ => false,
    }
}
