//! SQLite's writer: one transaction for what every table took, on a thread and a
//! connection of its own.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Lane, Lanes, Pushed};
use crate::db::batch::{Batch, Returned};
use crate::db::{SqliteFile, StoreError};

pub(super) async fn write_sqlite(
    file: Arc<SqliteFile>,
    added: mpsc::UnboundedReceiver<Box<dyn Lane>>,
    closing: impl Future<Output = ()>,
) {
    let mut lanes = Lanes::new(added);
    // The writer's own connection, opened at its first transaction, and again after one
    // that left it in a state nobody knows. Its statements stay prepared for its life.
    let mut conn: Option<rusqlite::Connection> = None;
    tokio::pin!(closing);
    while let Some(tables) = lanes.ready(closing.as_mut()).await {
        let (batch, groups) = transaction(tables);
        let mut committed = match conn.take().map_or_else(|| file.open(), Ok) {
            Ok(open) => {
                let (committed, usable) = commit(&open, batch);
                if usable {
                    conn = Some(open);
                }
                committed
            }
            Err(err) => Err(StoreError::sqlite(err)),
        };
        for group in groups {
            group.finish(committed.as_mut().map_err(|err| &*err));
        }
    }
}

/// The transaction that writes what the tables took, and their groups in it: each table's
/// statements, taking the write lock at once (waiting within the busy timeout for a
/// transaction of the pool's connection), so that no statement of it meets another writer.
fn transaction(tables: &mut [Box<dyn Lane>]) -> (Batch, Vec<Box<dyn Pushed>>) {
    let mut batch = Batch::default();
    batch.push("BEGIN IMMEDIATE");
    let groups = tables
        .iter_mut()
        .filter(|t| t.taken())
        .map(|t| t.push(&mut batch))
        .collect();
    batch.push("COMMIT");
    (batch, groups)
}

/// Runs the `transaction` on `conn`; what its statements returned, past its `BEGIN`, and
/// whether `conn` is fit for the next. The first failure rolls back all of them.
fn commit(conn: &rusqlite::Connection, transaction: Batch) -> (Result<Returned, StoreError>, bool) {
    match transaction.run(conn) {
        Ok(mut returned) => {
            returned.skip();
            (Ok(returned), true)
        }
        Err(err) => {
            // The batch stopped at the statement that failed: inside the transaction, or
            // at a `COMMIT` that failed and left it open. No transaction open (`BEGIN`
            // failed, or SQLite rolled back a failed `COMMIT` itself): nothing to undo.
            // Should the rollback fail, the connection is closed rather than used on in
            // a state nobody knows.
            let usable = conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok();
            (Err(err), usable)
        }
    }
}
