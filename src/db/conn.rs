//! Connections and transactions of either driver. A store's statement takes a [`Conn`],
//! which a pooled connection and a transaction both lend, so the same statement runs on
//! its own or inside a commit that carries other tables' rows too.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Connection, Transaction};

use super::error::StoreError;

/// A connection lent to one statement: from a [`Pooled`] connection or from a [`Tx`].
pub enum Conn<'c> {
    Postgres(&'c mut PgConnection),
    Sqlite(&'c mut SqliteConnection),
}

/// A connection held from the pool until dropped.
pub enum Pooled {
    Postgres(PoolConnection<Postgres>),
    Sqlite(PoolConnection<Sqlite>),
}

/// A transaction on a [`Pooled`] connection; rolled back if dropped uncommitted.
pub enum Tx<'c> {
    Postgres(Transaction<'c, Postgres>),
    Sqlite(Transaction<'c, Sqlite>),
}

impl Pooled {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Pooled::Postgres(c) => Conn::Postgres(c),
            Pooled::Sqlite(c) => Conn::Sqlite(c),
        }
    }

    /// Begins a transaction. A failure here is [`StoreError::Unreachable`]: nothing of the
    /// transaction's statements can have been sent.
    pub async fn begin(&mut self) -> Result<Tx<'_>, StoreError> {
        Ok(match self {
            Pooled::Postgres(c) => Tx::Postgres(c.begin().await.map_err(StoreError::unreachable)?),
            Pooled::Sqlite(c) => Tx::Sqlite(c.begin().await.map_err(StoreError::unreachable)?),
        })
    }
}

impl Tx<'_> {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Postgres(tx) => Conn::Postgres(tx),
            Tx::Sqlite(tx) => Conn::Sqlite(tx),
        }
    }

    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => tx.commit().await?,
            Tx::Sqlite(tx) => tx.commit().await?,
        }
        Ok(())
    }
}
