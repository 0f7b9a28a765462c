//! SQLite statements sent to SQLite's thread as one command.
//!
//! sqlx runs a SQLite connection on a thread of its own, and each statement is a round
//! trip to it: the task hands the statement over, the thread wakes, runs it, hands the
//! rows back, and the task waits for a worker of the runtime to run it again. SQLite's one
//! writer ran every transaction that way, `BEGIN`, each table's statements and `COMMIT`
//! (eight hand-offs with a pool's acquire), and under 64 keyed checkouts in flight it
//! never idled while the host had a core's fifth to spare (issue 34). A [`Batch`] is
//! several statements in one text with their arguments in order (sqlx's SQLite driver
//! binds each statement's `?`s from where the last one's ended), run in one command: the
//! thread runs them back to back, and the task collects each statement's rows.
//!
//! A group's rows are one argument, a JSON array of rows (each an array of its values),
//! which the statement reads with `jsonb_each`: SQLite has no arrays, and this is its
//! `UNNEST`. A statement's text is then the same for a group of any size, prepared once
//! per connection. Written as a multi-row `VALUES`, every group size was a text of its
//! own, parsed afresh: under 64 keyed checkouts in flight, SQLite's parser was 42 % of
//! the instructions of SQLite's thread (callgrind), the thread every write waits for.

use std::mem;

use futures_util::TryStreamExt;
use sqlx::sqlite::{Sqlite, SqliteConnection, SqliteRow};
use sqlx::{Either, Executor, FromRow, QueryBuilder};

use super::StoreError;

/// Statements to run in order, in one command.
pub struct Batch {
    sql: QueryBuilder<Sqlite>,
    statements: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            sql: QueryBuilder::new(""),
            statements: 0,
        }
    }
}

impl Batch {
    /// Adds `statement`, which takes no argument.
    pub fn push(&mut self, statement: &str) {
        self.sql.push(statement).push("; ");
        self.statements += 1;
    }

    /// Adds `statement`, whose one `?` is `rows`, as a JSON array of rows (tuples, each a
    /// JSON array of its values: the statement reads value `n` of a row as `value ->> n`).
    pub fn push_rows(&mut self, statement: &str, rows: impl serde::Serialize) {
        let rows = serde_json::to_string(&rows).expect("rows of strings and numbers");
        let (head, tail) = statement
            .split_once('?')
            .expect("a statement of rows has one `?`");
        debug_assert!(!tail.contains('?'), "a statement of rows has one `?`");
        self.sql.push(head).push_bind(rows).push(tail).push("; ");
        self.statements += 1;
    }

    /// Runs the statements; the rows each returned, in order. The first statement that
    /// fails ends the batch: what the statements before it did stands unless the
    /// batch's transaction is rolled back.
    pub async fn run(mut self, conn: &mut SqliteConnection) -> Result<Returned, StoreError> {
        // The text is one of a few (the writer's transaction, one for each set of tables
        // with rows; a budgeted charge's two statements; a refund's journal steps), so
        // it is kept prepared.
        let query = self.sql.build().persistent(true);
        let mut results = conn.fetch_many(query);
        let mut returned = Vec::with_capacity(self.statements);
        let mut rows = Vec::new();
        while let Some(result) = results.try_next().await? {
            match result {
                Either::Left(_done) => returned.push(mem::take(&mut rows)),
                Either::Right(row) => rows.push(row),
            }
        }
        Ok(Returned(returned.into_iter()))
    }
}

/// The rows each statement of a [`Batch`] returned, taken statement by statement.
pub struct Returned(std::vec::IntoIter<Vec<SqliteRow>>);

impl Returned {
    /// The next statement's rows, as `T`s.
    pub fn rows<T: for<'r> FromRow<'r, SqliteRow>>(&mut self) -> Result<Vec<T>, StoreError> {
        let rows = self.0.next().ok_or_else(|| {
            StoreError::Corrupt("a batch returned fewer statements than it ran".into())
        })?;
        Ok(rows.iter().map(T::from_row).collect::<Result<_, _>>()?)
    }

    /// Passes over the next statement, whatever it returned.
    pub fn skip(&mut self) {
        self.0.next();
    }
}
