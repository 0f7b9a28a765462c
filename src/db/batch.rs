//! A commit's statements, run as one unit: SQLite's transaction ([`Batch`]) and Postgres's
//! one statement ([`PgBatch`]), each holding every table's group of the moment.
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
//! own, parsed afresh: under 64 keyed checkouts in flight, SQLite's parser took a large
//! share of the instructions of SQLite's thread (callgrind), the thread every write waits
//! for.
//!
//! A statement that returns rows returns each as one JSON array of its values
//! (`RETURNING json_array(…)`, Postgres's parts `json_build_array(…)`), read back with
//! serde: one form for every runner.

use std::fmt::Write as _;
use std::mem;
use std::sync::Arc;

use futures_util::TryStreamExt;
use serde::de::DeserializeOwned;
use sqlx::postgres::{PgArguments, PgConnection, Postgres};
use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Arguments, Either, Executor, QueryBuilder, Row};

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

/// Postgres: what every table's group of the moment writes, as one statement.
///
/// Postgres pays a statement, not a row: a statement a table, each its own round trip and
/// commit, cost Postgres's CPU and the service's far beyond its rows (`pgbench` of two
/// inserts apart against the two as one statement's CTEs, generic plans), and keyed
/// checkouts, with three tables' groups, spent twice a keyless one's CPU (figure 13,
/// docs/benchmark.md).
///
/// Each table adds a part: its data-modifying CTEs, whose parameters it numbers `$1`,
/// `$2`… in its own text (they are numbered on after those of the parts before), and the
/// rows that say what became of its group, each one JSON array of its values (as
/// SQLite's statements return theirs), read back part by part into a [`Returned`].
/// Every part sees the snapshot the statement began with, and they commit together or not
/// at all.
#[derive(Default)]
pub struct PgBatch {
    parts: Vec<PgPart>,
    args: PgArguments,
    params: usize,
    /// The first value that would not bind.
    unbound: Option<sqlx::error::BoxDynError>,
}

/// One table's part of a [`PgBatch`].
#[derive(Clone, Copy)]
pub struct PgPart {
    /// Its CTEs, `name AS (…)` separated by commas, parameters numbered from `$1`.
    ctes: &'static str,
    /// What became of its rows: `expression FROM cte`, the expression one JSON array of
    /// the row's values, as text.
    rows: &'static str,
    /// Its rows may commit without waiting for the WAL's flush (its text joins the CTE
    /// `unflushed`): the statement does so when all its parts may.
    unflushed: bool,
    /// How many parameters `ctes` names.
    params: usize,
}

impl PgPart {
    pub const fn new(ctes: &'static str, rows: &'static str, unflushed: bool) -> PgPart {
        PgPart {
            ctes,
            rows,
            unflushed,
            params: params(ctes),
        }
    }
}

impl PgBatch {
    /// Adds `part`, whose parameters `bind` then binds in the order of their numbers.
    pub fn part(&mut self, part: PgPart, bind: impl FnOnce(&mut PgBinder<'_>)) {
        let before = self.args.len();
        bind(&mut PgBinder(self));
        debug_assert!(
            self.unbound.is_some() || self.args.len() - before == part.params,
            "a part binds each of its parameters: {}",
            part.ctes
        );
        self.params += part.params;
        self.parts.push(part);
    }

    /// Runs the statement on `conn`, its one commit; what each part's rows became, part by
    /// part in the order they were added.
    pub async fn run(self, conn: &mut PgConnection) -> Result<Returned, StoreError> {
        let text = self.text().into();
        self.run_text(conn, text).await
    }

    /// Which parts the statement has: its text is the same for the same parts.
    pub(super) fn key(&self) -> Vec<usize> {
        self.parts
            .iter()
            .map(|p| p.ctes.as_ptr() as usize)
            .collect()
    }

    /// The statement's text.
    pub(super) fn text(&self) -> String {
        let mut sql = String::from("WITH ");
        let mut params = 0;
        if self.parts.iter().any(|p| p.unflushed) {
            let _ = write!(
                sql,
                "unflushed AS (SELECT set_config('synchronous_commit', CASE WHEN ${}::bool \
                 THEN 'off' ELSE current_setting('synchronous_commit') END, true)), ",
                self.params + 1
            );
        }
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&renumbered(part.ctes, params));
            params += part.params;
        }
        for (i, part) in self.parts.iter().enumerate() {
            let glue = if i == 0 {
                " SELECT "
            } else {
                " UNION ALL SELECT "
            };
            let _ = write!(sql, "{glue}{i}::int4, {}", part.rows);
        }
        sql
    }

    /// [`run`](Self::run) with the statement's `text` at hand.
    pub(super) async fn run_text(
        self,
        conn: &mut PgConnection,
        text: Arc<str>,
    ) -> Result<Returned, StoreError> {
        let mut unbound = self.unbound;
        let mut args = self.args;
        if self.parts.iter().any(|p| p.unflushed)
            && let Err(err) = args.add(self.parts.iter().all(|p| p.unflushed))
        {
            unbound.get_or_insert(err);
        }
        if let Some(err) = unbound {
            return Err(sqlx::Error::Encode(err).into());
        }
        let returned: Vec<(i32, String)> = sqlx::query_as_with(sqlx::AssertSqlSafe(text), args)
            .fetch_all(conn)
            .await?;
        let mut parts = vec![Vec::new(); self.parts.len()];
        for (part, row) in returned {
            let part = usize::try_from(part)
                .ok()
                .and_then(|i| parts.get_mut(i))
                .ok_or_else(|| StoreError::Corrupt(format!("a row of no part ({part})")))?;
            part.push(row);
        }
        Ok(Returned(parts.into_iter()))
    }
}

/// Binds a part's parameters, in the order of their numbers.
pub struct PgBinder<'b>(&'b mut PgBatch);

impl PgBinder<'_> {
    pub fn bind<'t, T>(&mut self, value: T) -> &mut Self
    where
        T: sqlx::Encode<'t, Postgres> + sqlx::Type<Postgres>,
    {
        if let Err(err) = self.0.args.add(value) {
            self.0.unbound.get_or_insert(err);
        }
        self
    }
}

/// How many parameters `text` names (its highest `$n`); a `const fn`, so that a part's
/// count is known when it is compiled.
const fn params(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut i, mut most) = (0, 0);
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let mut n = 0;
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                n = n * 10 + (bytes[i] - b'0') as usize;
                i += 1;
            }
            if n > most {
                most = n;
            }
        } else {
            i += 1;
        }
    }
    most
}

/// `text` with each parameter `$n` as `$(n + after)`.
fn renumbered(text: &str, after: usize) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let n: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .expect("a parameter is `$` and its number");
        let _ = write!(out, "${}", n + after);
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{params, renumbered};

    /// A part's parameters are numbered on after the parts before it, however many digits.
    #[test]
    fn a_parts_parameters_are_numbered_on_after_those_before_it() {
        assert_eq!(
            renumbered("UNNEST($1::text[], $10::int8[]) WHERE a = $2 OR b = $1", 9),
            "UNNEST($10::text[], $19::int8[]) WHERE a = $11 OR b = $10"
        );
        assert_eq!(renumbered("SELECT 1", 3), "SELECT 1");
        assert_eq!(params("SELECT 1"), 0);
        assert_eq!(params("UNNEST($1::text[], $10::int8[]) WHERE a = $2"), 10);
    }
}
