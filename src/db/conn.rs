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
