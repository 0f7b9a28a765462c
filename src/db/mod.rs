//! The database behind receipts and idempotency records: Postgres when `DATABASE_URL`
//! says `postgres://`, else a SQLite file (the embedded default).
//!
//! The one place that names both drivers. Stores write one SQL text per statement and run
//! it on a [`Conn`] with `on_conn!`; both dialects' migrations define a `clock` view
//! (`now_ms`, epoch milliseconds), so a statement that needs the time reads the database's
//! clock the same way on both.

mod batch;
mod conn;
mod error;
mod group;
mod read_only;
#[cfg(test)]
pub(crate) mod sqlite_test;
mod url;

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::ConnectOptions;
use sqlx::pool::CloseEvent;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use batch::{Batch, PgBatch, PgBinder, PgPart, Returned};
pub use conn::{BeginWrite, Conn, Pooled};
pub use error::StoreError;
pub use group::{GroupWrite, GroupWriter, PG_WRITER_SETTINGS};
pub use url::check_url;

/// Whether a connection its user keeps, taken from the pool `held` ago, was taken before a
/// server refused a statement as read-only (25006): it may lead to a fenced or demoted
/// primary, and is let go, as the pool lets go of its own (`read_only`).
pub fn taken_before_read_only(held: std::time::Duration) -> bool {
    read_only::opened_before_seen(held)
}

type WeakWriter = tokio::sync::mpsc::WeakUnboundedSender<Box<dyn group::Lane>>;

/// Runs `$body` with `$c` bound to the driver's connection, whichever it is: one text of
/// Rust and SQL for both databases, type-checked against each.
macro_rules! on_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            $crate::db::Conn::Postgres($c) => $body,
            $crate::db::Conn::Sqlite($c) => $body,
        }
    };
}
pub(crate) use on_conn;

/// Pool sizing, from the settings.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

/// The service's database: a pool of either driver.
#[derive(Clone, Debug)]
pub struct Database {
    pool: Pool,
    /// A SQLite database this process holds alone: SQLite's own locks keep one process's
    /// writes whole, but two services sharing one file would each believe its pool and its
    /// idempotency leases are the only ones. So the file is locked for the process lifetime.
    _lock: Option<Arc<File>>,
    /// The one writer of every table's groups (`group/`), started with the first
    /// table's; weak, so that it ends with the tables' writers.
    writer: Arc<std::sync::Mutex<Option<WeakWriter>>>,
    /// The SQLite file, for the writer's own connection.
    sqlite_file: Option<Arc<SqliteFile>>,
}

/// What SQLite's writer opens its connection with: the pool's file and busy timeout.
#[derive(Debug)]
pub(crate) struct SqliteFile {
    path: PathBuf,
    busy_timeout: Duration,
}

impl SqliteFile {
    /// The writer's connection, set as the pool's are (`Database::open`); the file is in
    /// WAL mode already, since the pool's first connection.
    pub(crate) fn open(&self) -> rusqlite::Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open(&self.path)?;
        conn.busy_timeout(self.busy_timeout)?;
        conn.execute_batch(
            "PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY; PRAGMA foreign_keys = ON;",
        )?;
        Ok(conn)
    }
}

#[derive(Clone, Debug)]
enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
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
    #[error(
        "DATABASE_URL names an in-memory SQLite database ({0:?}): receipts must outlive the process, and SQLite's writer opens the file on a connection of its own; use a file (the default is sqlite://checkout.db)"
    )]
    InMemory(String),
}

/// Statements are logged (at debug) only when the log takes debug lines at all. Else sqlx
/// asks whether its line is wanted after every statement, through tracing-log and the
/// per-layer filters, is told yes, and builds the statement's summary for a line nobody
/// writes (`scripts/callgrind-profile` counts it in a keyless checkout's instructions).
/// Slow statements stay logged at warn (sqlx's default: over 1 s).
fn statement_level() -> log::LevelFilter {
    match crate::telemetry::debug_logs() {
        true => log::LevelFilter::Debug,
        false => log::LevelFilter::Off,
    }
}

static PG_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// What [`Database::migrate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// Migrations applied now.
    pub applied: usize,
    /// Migrations the database has, all applied: the ones applied now and before.
    pub total: usize,
}

impl Database {
    /// Opens the database `url` names and applies the migrations it lacks.
    pub async fn open(url: &str, pool: &PoolSettings) -> Result<Database, OpenError> {
        let db = Database::connect(url, pool).await?;
        db.run_migrations().await?;
        Ok(db)
    }

    async fn run_migrations(&self) -> Result<(), OpenError> {
        match &self.pool {
            Pool::Postgres(pg) => PG_MIGRATIONS.run(pg).await,
            Pool::Sqlite(sqlite) => SQLITE_MIGRATIONS.run(sqlite).await,
        }
        .map_err(OpenError::Migrate)
    }

    /// Applies the migrations the database lacks (`checkout migrate`; [`Database::open`]
    /// does it too).
    pub async fn migrate(&self) -> Result<Migrated, OpenError> {
        let before = match &self.pool {
            Pool::Postgres(pool) => {
                let mut conn = pool.acquire().await.map_err(OpenError::Connect)?;
                applied(&mut *conn, &PG_MIGRATIONS.table_name).await?
            }
            Pool::Sqlite(pool) => {
                let mut conn = pool.acquire().await.map_err(OpenError::Connect)?;
                applied(&mut *conn, &SQLITE_MIGRATIONS.table_name).await?
            }
        };
        self.run_migrations().await?;
        let total = match &self.pool {
            Pool::Postgres(_) => PG_MIGRATIONS
                .iter()
                .filter(|m| m.migration_type.is_up_migration())
                .count(),
            Pool::Sqlite(_) => SQLITE_MIGRATIONS
                .iter()
                .filter(|m| m.migration_type.is_up_migration())
                .count(),
        };
        Ok(Migrated {
            applied: total.saturating_sub(before),
            total,
        })
    }

    /// Connects to the database `url` names without migrating it: `checkout migrate`
    /// calls [`Database::migrate`] then.
    pub async fn connect(url: &str, pool: &PoolSettings) -> Result<Database, OpenError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let options = PgConnectOptions::from_str(url)
                .map_err(OpenError::Connect)?
                .log_statements(statement_level());
            let options = url::with_host_timeout(options, url, pool.acquire_timeout);
            if options.get_hosts().len() > 1 || options.get_target_session_attrs().as_str() != "any"
            {
                tracing::info!(
                    "each new database connection walks the hosts {}",
                    url::describe(&options)
                );
            }
            read_only::start_clock();
            let pg = PgPoolOptions::new()
                .max_connections(pool.max_connections)
                .acquire_timeout(pool.acquire_timeout)
                // No ping before each statement: it would double the round trips of a
                // charge. A connection that died idle fails its statement instead, which
                // is a transient error the loop retry repeats on a fresh connection.
                .test_before_acquire(false)
                // Connections opened before a server refused a statement as read-only
                // are closed, not lent or taken back (`read_only`).
                .before_acquire(|_, meta| {
                    Box::pin(async move { Ok(!read_only::opened_before_seen(meta.age)) })
                })
                .after_release(|_, meta| {
                    Box::pin(async move { Ok(!read_only::opened_before_seen(meta.age)) })
                })
                .connect_with(options)
                .await
                .map_err(OpenError::Connect)?;
            Ok(Database {
                pool: Pool::Postgres(pg),
                _lock: None,
                writer: Arc::default(),
                sqlite_file: None,
            })
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(OpenError::Connect)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // A receipt is a promise to a customer: FULL makes each commit durable
                // across power loss, not only across a process crash.
                .synchronous(SqliteSynchronous::Full)
                // A group's statement changes many rows inside the writer's transaction,
                // so SQLite keeps a statement journal to undo it alone; past 64 KiB that
                // journal was a file of its own, created, written and deleted every
                // other transaction (issue 34, strace under 64 keyed checkouts in
                // flight). In memory it is a buffer, freed with the statement.
                .pragma("temp_store", "memory")
                .busy_timeout(pool.acquire_timeout)
                .foreign_keys(true)
                .log_statements(statement_level());
            if url.contains(":memory:") || url.contains("mode=memory") {
                return Err(OpenError::InMemory(url.to_owned()));
            }
            let lock = Arc::new(lock_exclusively(options.get_filename())?);
            let sqlite_file = SqliteFile {
                path: options.get_filename().to_owned(),
                busy_timeout: pool.acquire_timeout,
            };
            // One connection for every statement but the group writer's, which has its own
            // (`group::Writer`): SQLite writes one transaction at a time anyway.
            let sqlite = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(pool.acquire_timeout)
                .test_before_acquire(false)
                .connect_with(options)
                .await
                .map_err(OpenError::Connect)?;
            Ok(Database {
                pool: Pool::Sqlite(sqlite),
                _lock: Some(lock),
                writer: Arc::default(),
                sqlite_file: Some(Arc::new(sqlite_file)),
            })
        } else {
            Err(OpenError::Scheme(url.chars().take(40).collect()))
        }
    }

    /// The one writer of every table's groups, started with the first table's.
    fn writer(&self) -> group::Writer {
        let mut weak = self
            .writer
            .lock()
            .expect("not poisoned: nothing panics while it is held");
        if let Some(running) = weak.as_ref().and_then(group::Writer::upgrade) {
            return running;
        }
        let started = group::Writer::start(self, self.sqlite_file.clone());
        *weak = Some(started.downgrade());
        started
    }

    /// `postgres` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self.pool {
            Pool::Postgres(_) => "postgres",
            Pool::Sqlite(_) => "sqlite",
        }
    }

    /// A connection from the pool. A failure is [`StoreError::Unreachable`]: no statement
    /// was sent.
    pub async fn acquire(&self) -> Result<Pooled, StoreError> {
        Ok(match &self.pool {
            Pool::Postgres(pool) => {
                Pooled::Postgres(pool.acquire().await.map_err(StoreError::unreachable)?)
            }
            Pool::Sqlite(pool) => {
                Pooled::Sqlite(pool.acquire().await.map_err(StoreError::unreachable)?)
            }
        })
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query("SELECT 1").execute(c).await.map(drop))?;
        Ok(())
    }

    /// Connections open now (in use or idle).
    pub fn connections(&self) -> u32 {
        match &self.pool {
            Pool::Postgres(pool) => pool.size(),
            Pool::Sqlite(pool) => pool.size(),
        }
    }

    /// The most connections the pool opens (SQLite: one).
    pub fn max_connections(&self) -> u32 {
        match &self.pool {
            Pool::Postgres(pool) => pool.options().get_max_connections(),
            Pool::Sqlite(pool) => pool.options().get_max_connections(),
        }
    }

    /// Resolves when [`Database::close`] begins: a task holding a connection lets it go.
    pub fn close_event(&self) -> CloseEvent {
        match &self.pool {
            Pool::Postgres(pool) => pool.close_event(),
            Pool::Sqlite(pool) => pool.close_event(),
        }
    }

    pub async fn close(&self) {
        match &self.pool {
            Pool::Postgres(pool) => pool.close().await,
            Pool::Sqlite(pool) => pool.close().await,
        }
    }
}

/// How many migrations the database has applied: the table of them made if missing, as
/// the migrator makes it, under the migrator's lock (two processes starting at once
/// would race to create it).
async fn applied(conn: &mut impl sqlx::migrate::Migrate, table: &str) -> Result<usize, OpenError> {
    conn.lock().await.map_err(OpenError::Migrate)?;
    let made = conn.ensure_migrations_table(table).await;
    let listed = match made {
        Ok(()) => conn.list_applied_migrations(table).await,
        Err(err) => Err(err),
    };
    conn.unlock().await.map_err(OpenError::Migrate)?;
    Ok(listed.map_err(OpenError::Migrate)?.len())
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
