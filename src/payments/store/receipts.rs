//! The receipts table: one row per charged order. The unique `order_id` is the charge key:
//! a second charge of the same order conflicts here and changes nothing.
//!
//! Its columns are part of the operator contract and keep each database's own types
//! (Postgres: UUID and TIMESTAMPTZ; SQLite: the same values as text), so the group insert
//! binds them per driver; every other statement is one text for both.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

use crate::db::{Batch, Conn, GroupWrite, PgBatch, PgPart, Returned, StoreError, on_conn};
use crate::journal::wake::Wake;
use crate::journal::{self, NewEntry, PgEntries};
use crate::payments::keys::OrderId;
use crate::payments::money::{Currency, Money};
use crate::webhooks::{self, NewEvent};

/// Proof that an order was charged: the row a charge inserts, and what a read returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub id: Uuid,
    pub order_id: OrderId,
    pub amount: Money,
    /// The operation that made the charge (its `Idempotency-Key`, or the minted UUIDv7).
    pub operation_key: String,
    /// Whose operation it was ('' for an anonymous caller).
    pub caller: String,
    pub created_at: DateTime<Utc>,
    /// The payment provider's id of the charge; `None` for the ledger's own.
    pub provider_payment_id: Option<String>,
}

/// A charge for the group writer: its receipt row, and the journal entries and the
/// `charge.succeeded` event that commit with it if the row goes in.
#[derive(Debug)]
pub struct ChargeRow {
    pub receipt: Receipt,
    pub entries: Vec<NewEntry>,
    pub event: Option<NewEvent>,
}

/// Postgres's part, one text for a group of any size, so that Postgres prepares it once
/// per connection: the receipts, and (data-modifying CTEs of the same statement, so the
/// same commit) the journal entries and the events of those that went in; the receipts
/// made, each as one JSON array of its values.
const INSERT_UNNEST: PgPart = PgPart::new(
    concat!(
        "charged AS (",
        "INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at, caller, provider_payment_id) ",
        "SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::timestamptz[], $7::text[], $21::text[]) ",
        "ON CONFLICT (order_id) DO NOTHING ",
        "RETURNING CAST(id AS TEXT) AS id, order_id, amount_minor, currency, operation_key, caller, created_at, provider_payment_id), ",
        journal::pg_with_charged!(),
        ", ",
        webhooks::pg_events_of_charged!()
    ),
    "json_build_array(id, order_id, amount_minor, currency, operation_key, caller, created_at, provider_payment_id)::text FROM charged",
    false,
);

/// SQLite's: the rows are one JSON array (`db::Batch::push_rows`), its `UNNEST`.
const INSERT_JSON: &str = "\
    INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at, caller, provider_payment_id) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7 \
    FROM jsonb_each(?) WHERE true \
    ON CONFLICT (order_id) DO NOTHING \
    RETURNING json_array(CAST(id AS TEXT), order_id, amount_minor, currency, operation_key, caller, created_at, provider_payment_id)";

const FIND: &str = "\
    SELECT CAST(id AS TEXT) AS id, order_id, amount_minor, currency, operation_key, caller, created_at, provider_payment_id \
    FROM receipts WHERE order_id = $1";

/// The group writer's side of the table.
pub struct Charges(pub Arc<Wake>);

impl GroupWrite for Charges {
    type Row = ChargeRow;
    /// The receipt when this row was inserted; `None` when its order was charged before.
    type Out = Option<Receipt>;

    fn order(a: &ChargeRow, b: &ChargeRow) -> Ordering {
        a.receipt.order_id.as_str().cmp(b.receipt.order_id.as_str())
    }

    /// Part of the writer's one statement (an explicit transaction would cost two more
    /// round trips, and would turn "the charge committed, its answer lost" into "BEGIN's
    /// answer lost, nothing charged").
    fn push_pg(&self, batch: &mut PgBatch, rows: &[ChargeRow]) {
        push_postgres(batch, rows);
    }

    fn read_pg(
        &self,
        rows: &[ChargeRow],
        returned: &mut Returned,
    ) -> Result<Vec<Self::Out>, StoreError> {
        Ok(outs(rows, read_postgres(returned)?))
    }

    fn push(&self, batch: &mut Batch, rows: &[ChargeRow]) {
        push_sqlite(batch, rows);
    }

    fn read(
        &self,
        rows: &[ChargeRow],
        returned: &mut Returned,
    ) -> Result<Vec<Self::Out>, StoreError> {
        Ok(outs(rows, read_sqlite(rows, returned)?))
    }

    /// The streams of the charged operations may read the charge's journal row now.
    fn committed(&self, rows: &[ChargeRow]) {
        self.0.committed(rows.iter().flat_map(|r| &r.entries));
    }
}

/// Each row's receipt, if `made` has it (it went in).
fn outs(rows: &[ChargeRow], made: Vec<Receipt>) -> Vec<Option<Receipt>> {
    let mut made: HashMap<Uuid, Receipt> = made.into_iter().map(|r| (r.id, r)).collect();
    rows.iter()
        .map(|row| made.remove(&row.receipt.id))
        .collect()
}

/// Inserts `rows` in one commit; the receipts it made, and the journal entries of those.
/// On Postgres one statement; on SQLite two, inside the caller's transaction (a budgeted
/// charge's; the group writer's goes through `push_sqlite`).
/// A row whose order was already charged (before, or by an earlier row of `rows`) is
/// skipped and not among them.
pub async fn insert(conn: Conn<'_>, rows: &[ChargeRow]) -> Result<Vec<Receipt>, StoreError> {
    match conn {
        Conn::Postgres(c) => {
            let mut batch = PgBatch::default();
            push_postgres(&mut batch, rows);
            read_postgres(&mut batch.run(c).await?)
        }
        Conn::Sqlite(c) => {
            let mut batch = Batch::default();
            push_sqlite(&mut batch, rows);
            read_sqlite(rows, &mut batch.run_sqlx(c).await?)
        }
    }
}

/// Postgres's part that inserts `rows` (`INSERT_UNNEST`).
fn push_postgres(batch: &mut PgBatch, rows: &[ChargeRow]) {
    let entries = PgEntries::of(rows.iter().flat_map(|r| {
        let receipt = r.receipt.id.to_string();
        r.entries.iter().map(move |e| (Some(receipt.clone()), e))
    }));
    let events = events_of(rows);
    let rows: Vec<&Receipt> = rows.iter().map(|r| &r.receipt).collect();
    batch.part(INSERT_UNNEST, |b| {
        b.bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.order_id.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.amount.minor()).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.amount.currency().code())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|r| r.operation_key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.caller.as_str()).collect::<Vec<_>>());
        entries.bind(b);
        b.bind(
            rows.iter()
                .map(|r| r.provider_payment_id.as_deref())
                .collect::<Vec<_>>(),
        );
        b.bind(
            events
                .iter()
                .map(|(e, _)| e.id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|(e, _)| e.kind.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|(e, _)| e.body.as_str())
                .collect::<Vec<_>>(),
        );
    });
}

/// The receipts [`push_postgres`]'s part made.
fn read_postgres(returned: &mut Returned) -> Result<Vec<Receipt>, StoreError> {
    let stored: Vec<Stored> = returned.rows()?;
    stored.into_iter().map(Stored::into_receipt).collect()
}

/// SQLite's two statements: the receipts, then the journal entries of the receipts that
/// went in (the entries name their receipt, and go in only if it is there: its id is
/// new, so it is there only if this batch put it there).
fn push_sqlite(batch: &mut Batch, rows: &[ChargeRow]) {
    let receipts: Vec<_> = rows
        .iter()
        .map(|r| {
            let r = &r.receipt;
            let created_at = r.created_at.to_rfc3339_opts(SecondsFormat::Micros, true);
            let (id, currency) = (r.id.hyphenated().to_string(), r.amount.currency().code());
            let order = r.order_id.as_str();
            let (key, payment) = (&r.operation_key, &r.provider_payment_id);
            (
                id,
                order,
                r.amount.minor(),
                currency,
                key,
                created_at,
                &r.caller,
                payment,
            )
        })
        .collect();
    batch.push_rows(INSERT_JSON, receipts);
    let entries: Vec<(Option<String>, &NewEntry)> = rows
        .iter()
        .flat_map(|r| {
            let receipt = r.receipt.id.hyphenated().to_string();
            r.entries.iter().map(move |e| (Some(receipt.clone()), e))
        })
        .collect();
    journal::push_sqlite(batch, &entries);
    let events = events_of(rows);
    if !events.is_empty() {
        let events: Vec<_> = events.iter().map(|(e, r)| (*e, r.as_str())).collect();
        webhooks::push_sqlite(batch, &events);
    }
}

/// The events of `rows`, each with the id of the receipt it announces (as the statements
/// write it).
fn events_of(rows: &[ChargeRow]) -> Vec<(&NewEvent, String)> {
    rows.iter()
        .filter_map(|r| {
            let receipt = r.receipt.id.hyphenated().to_string();
            r.event.as_ref().map(|e| (e, receipt))
        })
        .collect()
}

/// The receipts [`push_sqlite`]'s statements made (of `rows`).
fn read_sqlite(rows: &[ChargeRow], returned: &mut Returned) -> Result<Vec<Receipt>, StoreError> {
    let stored: Vec<Stored> = returned.rows()?;
    returned.skip();
    if rows.iter().any(|r| r.event.is_some()) {
        webhooks::skip_sqlite(returned);
    }
    stored.into_iter().map(Stored::into_receipt).collect()
}

/// The receipt of `order`, if it was charged.
pub async fn find(conn: Conn<'_>, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
    let stored: Option<Stored> = on_conn!(conn, c => sqlx::query_as(FIND)
        .bind(order.as_str())
        .fetch_optional(c)
        .await?);
    stored.map(Stored::into_receipt).transpose()
}

/// A row as both databases return it: the id cast to text by the statement, the time
/// decoded from TIMESTAMPTZ or from RFC 3339 text; or, from the writer's statements (both
/// databases), as one JSON array of these values in this order.
#[derive(sqlx::FromRow, serde::Deserialize)]
struct Stored {
    id: String,
    order_id: String,
    amount_minor: i64,
    currency: String,
    operation_key: String,
    caller: String,
    created_at: DateTime<Utc>,
    provider_payment_id: Option<String>,
}

impl Stored {
    /// Refuses values no charge could have written.
    fn into_receipt(self) -> Result<Receipt, StoreError> {
        let id = Uuid::parse_str(&self.id)
            .map_err(|e| StoreError::Corrupt(format!("receipt id {:?}: {e}", self.id)))?;
        let corrupt = |what: String| StoreError::Corrupt(format!("receipt {id}: {what}"));
        let currency = Currency::parse(&self.currency).map_err(|e| corrupt(e.to_string()))?;
        Ok(Receipt {
            id,
            order_id: OrderId::parse(&self.order_id)
                .map_err(|e| corrupt(format!("order id {e}")))?,
            amount: Money::from_minor(self.amount_minor, currency)
                .map_err(|e| corrupt(format!("amount {e}")))?,
            operation_key: self.operation_key,
            caller: self.caller,
            created_at: self.created_at,
            provider_payment_id: self.provider_payment_id,
        })
    }
}
