//! SQLite statements run back to back, as one unit.
//!
//! sqlx runs a SQLite connection on a thread of its own, and each statement is a round
//! trip to it: the task hands the statement over, the thread wakes, runs it, hands the
//! rows back, and the task waits for a worker of the runtime to run it again. SQLite's one
//! writer ran every transaction that way, `BEGIN`, each table's statements and `COMMIT`
//! (eight hand-offs with a pool's acquire), and under 64 keyed checkouts in flight it
//! never idled while the host had a core's fifth to spare (issue 34). A [`Batch`] is
//! the statements of a transaction with their arguments, run in one go: by SQLite's
//! writer, on its own thread and its own connection ([`Batch::run`]), with no hand-off at
//! all; or, inside a transaction of sqlx's (a budgeted charge, a refund's journal steps),
//! as one command to sqlx's thread ([`Batch::run_sqlx`]).
//!
//! A group's rows are one argument, a JSON array of rows (each an array of its values),
//! which the statement reads with `jsonb_each`: SQLite has no arrays, and this is its
//! `UNNEST`. A statement's text is then the same for a group of any size, prepared once
//! per connection. Written as a multi-row `VALUES`, every group size was a text of its
//! own, parsed afresh: under 64 keyed checkouts in flight, SQLite's parser was 42 % of
//! the instructions of SQLite's thread (callgrind), the thread every write waits for.
//!
//! A statement that returns rows returns each as one JSON array of its values
//! (`RETURNING json_array(…)`), read back with serde: one form for both runners.

use std::mem;

use futures_util::TryStreamExt;
use serde::de::DeserializeOwned;
use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Either, Executor, QueryBuilder, Row};

use super::StoreError;

/// Statements to run in order: each a text and, for a statement of rows, its one argument.
#[derive(Default)]
pub struct Batch {
    statements: Vec<(&'static str, Option<String>)>,
}

impl Batch {
    /// Adds `statement`, which takes no argument.
    pub fn push(&mut self, statement: &'static str) {
        self.statements.push((statement, None));
    }

    /// Adds `statement`, whose one `?` is `rows`, as a JSON array of rows (tuples, each a
    /// JSON array of its values: the statement reads value `n` of a row as `value ->> n`).
    pub fn push_rows(&mut self, statement: &'static str, rows: impl serde::Serialize) {
        debug_assert_eq!(
            statement.matches('?').count(),
            1,
            "a statement of rows has one `?`"
        );
        let rows = serde_json::to_string(&rows).expect("rows of strings and numbers");
        self.statements.push((statement, Some(rows)));
    }

    /// Runs the statements on `conn`, on the calling thread, which it blocks until they
    /// end (a `COMMIT` among them waits for the disk); the rows each returned, in order.
    /// The first statement that fails ends the batch: what the statements before it did
    /// stands unless the batch's transaction is rolled back. Each text is prepared once
    /// for the life of `conn`.
    pub fn run(self, conn: &rusqlite::Connection) -> Result<Returned, StoreError> {
        let mut returned = Vec::with_capacity(self.statements.len());
        for (sql, rows) in self.statements {
            let mut statement = conn.prepare_cached(sql).map_err(StoreError::sqlite)?;
            let mut out = Vec::new();
            let mut results = match &rows {
                Some(rows) => statement.query([rows]),
                None => statement.query([]),
            }
            .map_err(StoreError::sqlite)?;
            while let Some(row) = results.next().map_err(StoreError::sqlite)? {
                out.push(row.get(0).map_err(StoreError::sqlite)?);
            }
            returned.push(out);
        }
        Ok(Returned(returned.into_iter()))
    }

    /// Runs the statements as one command to sqlx's thread for `conn` (sqlx's SQLite
    /// driver binds each statement's `?`s from where the last one's ended); the rows each
    /// returned, in order. As [`run`](Self::run), the first failure ends it.
    pub async fn run_sqlx(self, conn: &mut SqliteConnection) -> Result<Returned, StoreError> {
        let mut sql = QueryBuilder::<Sqlite>::new("");
        let count = self.statements.len();
        for (statement, rows) in self.statements {
            match rows {
                Some(rows) => {
                    let (head, tail) = statement.split_once('?').expect("one `?`");
                    sql.push(head).push_bind(rows).push(tail);
                }
                None => {
                    sql.push(statement);
                }
            }
            sql.push("; ");
        }
        // The text is one of a few (a budgeted charge's two statements, a refund's journal
        // steps), so it is kept prepared.
        let query = sql.build().persistent(true);
        let mut results = conn.fetch_many(query);
        let mut returned = Vec::with_capacity(count);
        let mut rows = Vec::new();
        while let Some(result) = results.try_next().await? {
            match result {
                Either::Left(_done) => returned.push(mem::take(&mut rows)),
                Either::Right(row) => rows.push(row.try_get(0)?),
            }
        }
        Ok(Returned(returned.into_iter()))
    }
}

/// The rows each statement of a [`Batch`] returned (each one JSON array of its values),
/// taken statement by statement.
pub struct Returned(std::vec::IntoIter<Vec<String>>);

impl Returned {
    /// The next statement's rows, as `T`s (a tuple, or a struct read from the values in
    /// the order of its fields).
    pub fn rows<T: DeserializeOwned>(&mut self) -> Result<Vec<T>, StoreError> {
        let rows = self.0.next().ok_or_else(|| {
            StoreError::Corrupt("a batch returned fewer statements than it ran".into())
        })?;
        rows.iter()
            .map(|row| {
                serde_json::from_str(row)
                    .map_err(|err| StoreError::Corrupt(format!("a returned row {row}: {err}")))
            })
            .collect()
    }

    /// Passes over the next statement, whatever it returned.
    pub fn skip(&mut self) {
        self.0.next();
    }
}
