//! Postgres's writer: one statement for what every table took, on a connection it keeps.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc;

use super::{Lane, Lanes, Pushed};
use crate::db::batch::{PgBatch, Returned};
use crate::db::{Database, Pooled, StoreError, on_conn};

/// Postgres's writer: each time a table has rows, one statement for what every table
/// took, on a connection it keeps. One at a time: with two in flight (rows that came
/// while one was being written went in the next at once, on a second connection), each
/// statement held half the rows, and at 64 keyed checkouts in flight Postgres spent 182
/// µs of CPU a checkout where one at a time spent 93-106 (issue 34).
pub(super) async fn write_postgres(
    db: Database,
    added: mpsc::UnboundedReceiver<Box<dyn Lane>>,
    closing: impl Future<Output = ()>,
) {
    let mut lanes = Lanes::new(added);
    let mut conn = PgWriterConn {
        db,
        kept: None,
        texts: HashMap::new(),
        suspect: false,
    };
    tokio::pin!(closing);
    while let Some(tables) = lanes.ready(closing.as_mut()).await {
        let mut batch = PgBatch::default();
        let groups: Vec<_> = tables
            .iter_mut()
            .filter(|t| t.taken())
            .map(|t| t.push_pg(&mut batch))
            .collect();
        write_statement(&mut conn, batch, groups).await;
    }
}

/// Runs `batch` on `conn` and answers its `groups`. A statement is bounded by its
/// callers' patience, as a statement of their own would be: when every one of them has
/// given up (their loop timed out), so does the writer, and a statement whose answer
/// never comes cannot stall the rows after it.
async fn write_statement(
    conn: &mut PgWriterConn,
    batch: PgBatch,
    mut groups: Vec<Box<dyn Pushed>>,
) {
    let committed = {
        let write = conn.write(batch);
        let everyone_gone = poll_fn(|cx| {
            let mut gone = Poll::Ready(());
            for group in groups.iter_mut() {
                if group.poll_gone(cx).is_pending() {
                    gone = Poll::Pending;
                }
            }
            gone
        });
        tokio::select! {
            committed = write => Some(committed),
            () = everyone_gone => None,
        }
    };
    if let Some(mut committed) = committed {
        for group in groups {
            group.finish(committed.as_mut().map_err(|err| &*err));
        }
    }
}

/// A group's statement finds its rows by key: each row of the group one probe of the
/// table's primary key. Postgres plans a prepared statement once per connection and keeps
/// that plan until the table is next analyzed; planned while the table was small (a new
/// database, the first seconds under load), the plan scanned the whole table for every
/// row of the group, and kept doing so as the table grew, a group's time growing with the
/// table's rows (autovacuum, which analyzes, may be off or behind). With sequential scans off on the connection the writer keeps, the kept plan
/// probes by key whatever the table's size was when it was made (a pool of one
/// connection, which the writer does not keep, goes without). Planning every execution
/// afresh (`plan_cache_mode = force_custom_plan`) also mends it, at a plan's CPU every
/// keyed checkout.
///
/// JIT compilation goes off with them: a part that can only scan (the webhooks' part
/// reads the few rows of `webhook_subscriptions` with a `LIKE`) keeps its sequential
/// scan, costed as disabled, far above `jit_above_cost`, and Postgres then compiled the
/// whole statement at every execution, a wait that every checkout's commit took.
pub const BY_KEY: &str =
    "SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false)";

/// The connection of Postgres's writer, which it keeps when the pool has others to spare.
/// Taking one from the pool for every statement had the pool open new ones as load rose,
/// and opening one with TLS is slow (sqlx 0.9.0 left Nagle on, vendor/README.md), a stall
/// that every row of the statement waited out.
struct PgWriterConn {
    db: Database,
    kept: Option<Pooled>,
    /// Each statement's text, by its parts: built once.
    texts: HashMap<Vec<usize>, Arc<str>>,
    /// The last write failed: the next connection taken is tested first.
    suspect: bool,
}

impl PgWriterConn {
    async fn write(&mut self, batch: PgBatch) -> Result<Returned, StoreError> {
        let mut conn = match self.kept.take() {
            Some(conn) => conn,
            None => {
                // Boxed, as the statement is: taking a connection is a future of some
                // kilobytes, which every statement's future would otherwise carry.
                let taken = Box::pin(self.take()).await;
                self.suspect = taken.is_err();
                taken?
            }
        };
        let Pooled::Postgres(c) = &mut conn else {
            unreachable!("only Postgres's writer runs a statement of parts");
        };
        let text = self
            .texts
            .entry(batch.key())
            .or_insert_with(|| batch.text().into())
            .clone();
        // Kept only after a success: a connection that failed a statement is let go. The
        // statement's future is boxed: some kilobytes, moved into each future around it
        // unboxed (`scripts/callgrind-profile` counts the copies).
        let written = Box::pin(batch.run_text(c, text)).await;
        self.suspect = written.is_err();
        let written = written?;
        if self.keeps() {
            self.kept = Some(conn);
        }
        Ok(written)
    }

    /// A connection from the pool; after a failed write, one that answers a ping. A
    /// failure that was the database restarting leaves every idle connection of the pool
    /// dead, and without the ping each would fail a statement of its own (as many as the
    /// pool kept connections, where the loop retry has three attempts). The pool closes a
    /// connection whose ping failed when it is dropped.
    async fn take(&mut self) -> Result<Pooled, StoreError> {
        let mut conn = self.take_alive().await?;
        if let (true, Pooled::Postgres(c)) = (self.keeps(), &mut conn) {
            // The setting is this writer's: when it lets go of the connection (a failed
            // write, the end), the connection is closed, not handed to other statements.
            c.close_on_drop();
            sqlx::query(BY_KEY).execute(&mut **c).await?;
        }
        Ok(conn)
    }

    /// Whether the writer keeps its connection between statements: when the pool has
    /// others to spare.
    fn keeps(&self) -> bool {
        self.db.max_connections() > 1
    }

    async fn take_alive(&mut self) -> Result<Pooled, StoreError> {
        if self.suspect {
            for _ in 0..self.db.max_connections() {
                let mut conn = self.db.acquire().await?;
                let alive = on_conn!(conn.conn(), c => sqlx::Connection::ping(c).await);
                if alive.is_ok() {
                    return Ok(conn);
                }
            }
        }
        self.db.acquire().await
    }
}
