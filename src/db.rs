//! The database behind receipts and idempotency records: Postgres when `DATABASE_URL`
//! says `postgres://`, else a SQLite file (the embedded default).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// Pool sizing, from the settings.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

#[derive(Clone, Debug)]
pub enum Database {
    Postgres(PgPool),
    Sqlite(SqliteDb),
}

/// A SQLite database this process holds alone: SQLite's own locks keep one process's
/// writes whole, but two services sharing one file would each believe its pool and its
/// idempotency leases are the only ones. So the file is locked for the process lifetime.
#[derive(Clone, Debug)]
pub struct SqliteDb {
    pool: SqlitePool,
    _lock: Option<Arc<File>>,
}

impl SqliteDb {
    pub fn pool(&self) -> SqlitePool {
        self.pool.clone()
    }
}

/// Why the database could not be opened at start-up.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("DATABASE_URL must start with postgres://, postgresql:// or sqlite: (got {0:?})")]
    Scheme(String),
    #[error(
        "{path} is in use by another checkout process (lock file {lock}); SQLite serves one process, use Postgres to run several"
    )]
    InUse { path: String, lock: String },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("cannot apply migrations: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
}

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

static PG_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

impl Database {
    /// Opens the database `url` names and applies the migrations it lacks.
    pub async fn open(url: &str, pool: &PoolSettings) -> Result<Database, OpenError> {
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pg = PgPoolOptions::new()
                .max_connections(pool.max_connections)
                .acquire_timeout(pool.acquire_timeout)
                // No ping before each statement: it would double the round trips of a
                // charge. A connection that died idle fails its statement instead, which
                // is a transient error the loop retry repeats on a fresh connection.
                .test_before_acquire(false)
                .connect(url)
                .await
                .map_err(OpenError::Connect)?;
            PG_MIGRATIONS.run(&pg).await.map_err(OpenError::Migrate)?;
            Database::Postgres(pg)
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(OpenError::Connect)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // A receipt is a promise to a customer: FULL makes each commit durable
                // across power loss, not only across a process crash.
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(pool.acquire_timeout)
                .foreign_keys(true);
            let in_memory = url.contains(":memory:") || url.contains("mode=memory");
            let lock = if in_memory {
                None
            } else {
                Some(Arc::new(lock_exclusively(options.get_filename())?))
            };
            let sqlite = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(pool.acquire_timeout)
                .test_before_acquire(false)
                .connect_with(options)
                .await
                .map_err(OpenError::Connect)?;
            SQLITE_MIGRATIONS
                .run(&sqlite)
                .await
                .map_err(OpenError::Migrate)?;
            Database::Sqlite(SqliteDb {
                pool: sqlite,
                _lock: lock,
            })
        } else {
            return Err(OpenError::Scheme(url.chars().take(40).collect()));
        };
        Ok(db)
    }

    /// `postgres` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self {
            Database::Postgres(_) => "postgres",
            Database::Sqlite(_) => "sqlite",
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query("SELECT 1").execute(pool).await?;
            }
            Database::Sqlite(db) => {
                sqlx::query("SELECT 1").execute(&db.pool).await?;
            }
        }
        Ok(())
    }

    /// Connections open now (in use or idle).
    pub fn connections(&self) -> u32 {
        match self {
            Database::Postgres(pool) => pool.size(),
            Database::Sqlite(db) => db.pool.size(),
        }
    }

    pub async fn close(&self) {
        match self {
            Database::Postgres(pool) => pool.close().await,
            Database::Sqlite(db) => db.pool.close().await,
        }
    }
}

/// Takes an advisory lock on `<db>.lock` beside the database, held until the process ends.
fn lock_exclusively(db_path: &Path) -> Result<File, OpenError> {
    let mut lock_path = PathBuf::from(db_path);
    lock_path.as_mut_os_string().push(".lock");
    let lock_error = |source| OpenError::Lock {
        path: lock_path.display().to_string(),
        source,
    };
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(lock_error)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(OpenError::InUse {
                path: db_path.display().to_string(),
                lock: lock_path.display().to_string(),
            });
        }
        Err(TryLockError::Error(err)) => return Err(lock_error(err)),
    }
    file.set_len(0).map_err(lock_error)?;
    writeln!(file, "{}", std::process::id()).map_err(lock_error)?;
    Ok(file)
}
