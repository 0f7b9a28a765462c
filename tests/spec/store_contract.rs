//! One contract, two stores: every case runs against Postgres and against SQLite.

use std::sync::Arc;

use crate::common::{Backend, TestDb};
use checkout::db::{Database, PoolSettings};
use checkout::journal::{EntryKind, JournalKey, NewEntry};
use checkout::payments::{
    Charge, ChargeOutcome, Currency, Money, OperationKey, Order, OrderId, Receipt, Receipts,
};

#[allow(
    clippy::disallowed_methods,
    reason = "a test's fixed order, not a request's"
)]
fn order(id: &str, amount: &str, currency: &str) -> Order {
    let currency = Currency::parse(currency).unwrap();
    Order::new(
        OrderId::parse(id).unwrap(),
        Money::parse(amount, currency).unwrap(),
    )
}

async fn open(db: &TestDb) -> Database {
    let pool = PoolSettings {
        max_connections: 8,
        acquire_timeout: std::time::Duration::from_secs(5),
    };
    Database::open(&db.url, &pool)
        .await
        .expect("open the test database")
}

/// The whole contract, for either database.
async fn contract(store: Arc<Receipts>, db: &TestDb) {
    let op = OperationKey::mint();
    let a = order("C-1", "42.50", "USD");

    // The first charge creates the receipt, with exactly what was asked.
    let ChargeOutcome::Created(first) = store
        .charge(
            &Charge::new(&a.charge_key(), a.amount(), &op, ""),
            None,
            |_| Vec::new(),
        )
        .await
        .unwrap()
    else {
        panic!("the first charge must create a receipt");
    };
    assert_eq!(first.order_id.as_str(), "C-1");
    assert_eq!(first.amount, a.amount());
    assert_eq!(first.operation_key, op.as_str());

    // The same order and amount: the first receipt, unchanged, from any operation.
    let again = store
        .charge(
            &Charge::new(&a.charge_key(), a.amount(), &OperationKey::mint(), ""),
            None,
            |_| Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(again, ChargeOutcome::Existing(first.clone()));

    // Another amount: a conflict carrying the receipt that stands; nothing changes.
    let other = order("C-1", "42.51", "USD");
    let conflict = store
        .charge(
            &Charge::new(&other.charge_key(), other.amount(), &op, ""),
            None,
            |_| Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(conflict, ChargeOutcome::AmountConflict(first.clone()));
    // Another currency is another amount.
    let euros = order("C-1", "42.50", "EUR");
    assert!(matches!(
        store
            .charge(
                &Charge::new(&euros.charge_key(), euros.amount(), &op, ""),
                None,
                |_| Vec::new()
            )
            .await
            .unwrap(),
        ChargeOutcome::AmountConflict(_)
    ));
    assert_eq!(db.receipts("C-1").await, 1);

    // Reads give back what was stored, to the microsecond.
    assert_eq!(store.receipt(a.id()).await.unwrap(), Some(first));
    assert_eq!(
        store
            .receipt(&OrderId::parse("C-none").unwrap())
            .await
            .unwrap(),
        None
    );

    // Amounts round-trip exactly, whatever the currency's minor digits.
    for (id, amount, currency) in [
        ("C-2", "0.29", "USD"),
        ("C-3", "1500", "JPY"),
        ("C-4", "1.005", "KWD"),
    ] {
        let o = order(id, amount, currency);
        let ChargeOutcome::Created(r) = store
            .charge(
                &Charge::new(&o.charge_key(), o.amount(), &op, ""),
                None,
                |_| Vec::new(),
            )
            .await
            .unwrap()
        else {
            panic!("{id} must be created");
        };
        assert_eq!(
            store.receipt(o.id()).await.unwrap().unwrap().amount,
            r.amount
        );
        assert_eq!(r.amount.decimal(), amount);
    }

    // Fifty concurrent charges of one order: one Created, 49 Existing with that receipt.
    let race = order("C-RACE", "9.99", "USD");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let store = store.clone();
        let race = race.clone();
        tasks.spawn(async move {
            store
                .charge(
                    &Charge::new(&race.charge_key(), race.amount(), &OperationKey::mint(), ""),
                    None,
                    |_| Vec::new(),
                )
                .await
                .unwrap()
        });
    }
    let (mut created, mut existing, mut ids) = (0, 0, std::collections::HashSet::new());
    while let Some(outcome) = tasks.join_next().await {
        match outcome.unwrap() {
            ChargeOutcome::Created(r) => {
                created += 1;
                ids.insert(r.id);
            }
            ChargeOutcome::Existing(r) => {
                existing += 1;
                ids.insert(r.id);
            }
            ChargeOutcome::AmountConflict(r) => panic!("no conflict expected: {r:?}"),
            ChargeOutcome::OverBudget(left) => panic!("no budget was set: {left:?}"),
        }
    }
    assert_eq!((created, existing, ids.len()), (1, 49, 1));
    assert_eq!(db.receipts("C-RACE").await, 1);

    // A hundred orders, each charged twice at once, once for 1.00 and once for 2.00 (on
    // SQLite these land in the same group commits): per order one Created, and the other
    // charge an AmountConflict carrying that receipt.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        for amount in ["1.00", "2.00"] {
            let store = store.clone();
            let o = order(&format!("C-PAIR-{i}"), amount, "USD");
            tasks.spawn(async move {
                let outcome = store
                    .charge(
                        &Charge::new(&o.charge_key(), o.amount(), &OperationKey::mint(), ""),
                        None,
                        |_| Vec::new(),
                    )
                    .await
                    .unwrap();
                (o.id().clone(), outcome)
            });
        }
    }
    let mut by_order: std::collections::HashMap<OrderId, Vec<ChargeOutcome>> =
        std::collections::HashMap::new();
    while let Some(result) = tasks.join_next().await {
        let (id, outcome) = result.unwrap();
        by_order.entry(id).or_default().push(outcome);
    }
    assert_eq!(by_order.len(), 100);
    for (id, outcomes) in by_order {
        let created: Vec<&Receipt> = outcomes
            .iter()
            .filter_map(|o| match o {
                ChargeOutcome::Created(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(created.len(), 1, "{id}: {outcomes:?}");
        let conflict = outcomes
            .iter()
            .find(|o| matches!(o, ChargeOutcome::AmountConflict(_)));
        assert_eq!(
            conflict,
            Some(&ChargeOutcome::AmountConflict(created[0].clone())),
            "{id}: {outcomes:?}"
        );
        assert_eq!(store.receipt(&id).await.unwrap().as_ref(), Some(created[0]));
    }
    assert_eq!(
        db.count(
            "SELECT count(*) FROM receipts WHERE order_id LIKE 'C-PAIR-%'",
            None
        )
        .await,
        100
    );

    // Ten charges of one order at once, each with a journal step of its own operation (on
    // SQLite in one transaction, mostly): the step of the charge that went in is written,
    // and the nine that found its receipt write none.
    let journaled = order("C-JOURNAL", "3.00", "USD");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (store, journaled) = (store.clone(), journaled.clone());
        tasks.spawn(async move {
            let op = OperationKey::mint();
            let step = |receipt: &Receipt| {
                vec![NewEntry {
                    key: JournalKey {
                        caller: String::new(),
                        operation_key: op.as_str().to_owned(),
                        fence: None,
                    },
                    step: 1,
                    kind: EntryKind::Tool,
                    name: "charge".into(),
                    call_id: Some("call-1".into()),
                    body: format!("{{\"receipt\":\"{}\"}}", receipt.id),
                    pins: None,
                    input_tokens: None,
                    output_tokens: None,
                    ttl_ms: 60_000,
                }]
            };
            let key = journaled.charge_key();
            let charge = Charge::new(&key, journaled.amount(), &op, "");
            store.charge(&charge, None, step).await.unwrap()
        });
    }
    let mut created = Vec::new();
    while let Some(outcome) = tasks.join_next().await {
        if let ChargeOutcome::Created(r) = outcome.unwrap() {
            created.push(r);
        }
    }
    assert_eq!(created.len(), 1, "one charge of C-JOURNAL went in");
    assert_eq!(
        db.count("SELECT count(*) FROM agent_journal", None).await,
        1,
        "only the charge that went in journals"
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM agent_journal WHERE operation_key = $1",
            Some(&created[0].operation_key)
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract() {
    let db = TestDb::new(Backend::Postgres).await;
    let database = open(&db).await;
    assert_eq!(database.kind(), "postgres");
    contract(Arc::new(Receipts::new(&database, &Default::default())), &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_the_contract() {
    let db = TestDb::new(Backend::Sqlite).await;
    let database = open(&db).await;
    assert_eq!(database.kind(), "sqlite");
    contract(Arc::new(Receipts::new(&database, &Default::default())), &db).await;
}

/// Two instances on one Postgres, each writing groups of charges for the same orders,
/// listed in opposite orders: every group is inserted in order-id order, so the two wait
/// for each other in one order and never deadlock (a deadlock would fail a group with
/// 40P01 after a second). Each order ends with one receipt, made by one of the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_postgres_never_deadlock() {
    let db = TestDb::new(Backend::Postgres).await;
    let (a, b) = (open(&db).await, open(&db).await);
    let stores = [
        Arc::new(Receipts::new(&a, &Default::default())),
        Arc::new(Receipts::new(&b, &Default::default())),
    ];
    for round in 0..20 {
        let ids: Vec<String> = (0..10).map(|i| format!("D-{round}-{i}")).collect();
        let mut tasks = tokio::task::JoinSet::new();
        for (n, store) in stores.iter().enumerate() {
            let mut mine = ids.clone();
            if n == 1 {
                mine.reverse();
            }
            for id in mine {
                let (store, o) = (store.clone(), order(&id, "5.00", "USD"));
                tasks.spawn(async move {
                    store
                        .charge(
                            &Charge::new(&o.charge_key(), o.amount(), &OperationKey::mint(), ""),
                            None,
                            |_| Vec::new(),
                        )
                        .await
                });
            }
        }
        let mut created = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.unwrap() {
                Ok(ChargeOutcome::Created(_)) => created += 1,
                Ok(ChargeOutcome::Existing(_)) => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(created, 10, "round {round}: one receipt per order");
    }
    assert_eq!(
        db.count(
            "SELECT count(*) FROM receipts WHERE order_id LIKE 'D-%'",
            None
        )
        .await,
        200
    );
}

#[tokio::test]
async fn a_sqlite_file_serves_one_process_only() {
    let db = TestDb::new(Backend::Sqlite).await;
    let _first = open(&db).await;
    let pool = PoolSettings {
        max_connections: 1,
        acquire_timeout: std::time::Duration::from_secs(1),
    };
    let err = Database::open(&db.url, &pool).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("is in use by another checkout process"),
        "{err}"
    );
}

/// The service's connections to Postgres write without Nagle's delay (issue 34). A
/// statement over 16 KiB leaves rustls in two writes; with Nagle on, the second waits for
/// the first's ACK, which Postgres, waiting for the rest, sends only on its 40 ms
/// delayed-ACK timer. sqlx 0.9.0 leaves Nagle on; vendor/sqlx-core carries upstream's fix
/// until a release does. The speed itself is the benchmark's (figure 10), never a timed
/// test.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn postgres_connections_are_opened_without_nagle() {
    let db = TestDb::new(Backend::Postgres).await;
    let opened = open(&db).await;
    let mut conn = opened.acquire().await.expect("a connection");
    // The connection's own port, as Postgres sees it: the socket to look at.
    let port: i32 = match conn.conn() {
        checkout::db::Conn::Postgres(c) => sqlx::query_scalar("SELECT inet_client_port()")
            .fetch_one(c)
            .await
            .expect("the client port"),
        checkout::db::Conn::Sqlite(_) => unreachable!("a Postgres test database"),
    };
    let mut found = None;
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Some(fd) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<libc::c_int>().ok())
        else {
            continue;
        };
        let mut local: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&local) as libc::socklen_t;
        // SAFETY: `local` is writable for `len` bytes; a descriptor closed meanwhile fails.
        if unsafe { libc::getsockname(fd, (&raw mut local).cast(), &mut len) } != 0 {
            continue;
        }
        let local_port = match libc::c_int::from(local.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let v4 = unsafe { &*(&raw const local).cast::<libc::sockaddr_in>() };
                u16::from_be(v4.sin_port)
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let v6 = unsafe { &*(&raw const local).cast::<libc::sockaddr_in6>() };
                u16::from_be(v6.sin6_port)
            }
            _ => continue,
        };
        if i32::from(local_port) != port {
            continue;
        }
        let mut nodelay: libc::c_int = 0;
        let mut size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `nodelay` is writable for `size` bytes.
        let read = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&raw mut nodelay).cast(),
                &mut size,
            )
        };
        if read == 0 {
            found = Some((fd, nodelay));
        }
    }
    let (fd, nodelay) = found.unwrap_or_else(|| panic!("no socket of local port {port}"));
    assert_eq!(
        nodelay, 1,
        "descriptor {fd}, the pool's connection to Postgres, has Nagle on"
    );
    drop(conn);
    opened.close().await;
}
