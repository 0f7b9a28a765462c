//! Connections of either driver. A store's statement takes a [`Conn`], which a pooled
//! connection lends (and a transaction can lend as well, when a commit must carry rows of
//! more than one table), so statements are written once, not once per way of running them.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::sqlite::{Sqlite, SqliteConnection};

/// A connection lent to one statement.
pub enum Conn<'c> {
    Postgres(&'c mut PgConnection),
    Sqlite(&'c mut SqliteConnection),
}

impl Conn<'_> {
    /// This connection, lent again for one statement of several.
    pub fn reborrow(&mut self) -> Conn<'_> {
        match self {
            Conn::Postgres(c) => Conn::Postgres(c),
            Conn::Sqlite(c) => Conn::Sqlite(c),
        }
    }
}

/// A connection held from the pool until dropped.
pub enum Pooled {
    Postgres(PoolConnection<Postgres>),
    Sqlite(PoolConnection<Sqlite>),
}

impl Pooled {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Pooled::Postgres(c) => Conn::Postgres(c),
            Pooled::Sqlite(c) => Conn::Sqlite(c),
        }
    }
}

/// A transaction's connection, lent to the statements of one commit.
impl<'c> From<&'c mut PgConnection> for Conn<'c> {
    fn from(c: &'c mut PgConnection) -> Self {
        Conn::Postgres(c)
    }
}

impl<'c> From<&'c mut SqliteConnection> for Conn<'c> {
    fn from(c: &'c mut SqliteConnection) -> Self {
        Conn::Sqlite(c)
    }
}

/// Begins a transaction that writes. On SQLite it is `BEGIN IMMEDIATE`, which takes the
/// write lock at once, waiting within the busy timeout while SQLite's writer commits on
/// its own connection (`db::group`): a deferred `BEGIN` that read before it wrote could
/// not write at all once the writer had committed in between (`SQLITE_BUSY_SNAPSHOT`,
/// which no busy timeout waits out).
pub trait BeginWrite: sqlx::Connection {
    fn begin_write(
        &mut self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'_, Self::Database>, sqlx::Error>> + Send;
}

impl BeginWrite for sqlx::PgConnection {
    fn begin_write(
        &mut self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'_, Postgres>, sqlx::Error>> + Send {
        sqlx::Connection::begin(self)
    }
}

impl BeginWrite for sqlx::SqliteConnection {
    fn begin_write(
        &mut self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'_, Sqlite>, sqlx::Error>> + Send {
        sqlx::Connection::begin_with(self, "BEGIN IMMEDIATE")
    }
}
