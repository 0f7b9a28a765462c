//! For unit tests of the statements a worker runs again and again: SQLite's schema by the
//! migrations of the source tree, in memory, and whether a statement stays prepared.
//! SQLite (3.51) prepares a statement whose `LIMIT` is a parameter again at every
//! execution, as if the schema had changed; a limit written in the text is not.

use rusqlite::{Connection, StatementStatus, ToSql};

/// SQLite's schema, by the migrations of the source tree, in memory.
pub fn schema() -> Connection {
    let db = Connection::open_in_memory().unwrap();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    for file in files {
        db.execute_batch(&std::fs::read_to_string(&file).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
    db
}

/// How many times `sql`, prepared once and run three times with `params`, was prepared
/// again.
pub fn prepared_again(db: &Connection, sql: &str, params: &[&dyn ToSql]) -> i32 {
    let mut statement = db.prepare(sql).unwrap();
    for _ in 0..3 {
        let mut answered = statement.query(params).unwrap();
        while answered.next().unwrap().is_some() {}
    }
    statement.get_status(StatementStatus::RePrepare)
}
