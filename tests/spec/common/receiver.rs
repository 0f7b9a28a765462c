//! A webhook endpoint for the tests: records every request (headers, body, when) and
//! answers each from a script (then 204), and the consumer's check of what it received,
//! made with Standard Webhooks' reference library (`tests/webhooks/verify.py`, in the
//! venv `scripts/test` installs).

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// How the endpoint answers one request.
#[derive(Clone, Debug)]
pub enum Answer {
    Status(u16),
    /// A status with one header (`Retry-After`, `Location`).
    With(u16, &'static str, &'static str),
    /// No answer at all: the request hangs until its sender gives up or goes away.
    Hang,
}

/// One request received.
#[derive(Clone, Debug)]
pub struct Got {
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
    pub at: Instant,
    /// The status it was answered with (`None`: it hung).
    pub status: Option<u16>,
}

impl Got {
    pub fn id(&self) -> &str {
        &self.headers["webhook-id"]
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }
}

#[derive(Default)]
struct Book {
    got: Vec<Got>,
    script: VecDeque<Answer>,
}

pub struct Receiver {
    /// The endpoint's URL (`/hooks`; any path is answered alike).
    pub url: String,
    book: Arc<Mutex<Book>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// An endpoint answering its first requests with `script`, then 204.
    pub async fn start(script: Vec<Answer>) -> Receiver {
        let book = Arc::new(Mutex::new(Book {
            got: Vec::new(),
            script: script.into(),
        }));
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(book.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the receiver serves");
        });
        Receiver {
            url,
            book,
            _task: task,
        }
    }

    /// Every request so far, in order of arrival.
    pub fn got(&self) -> Vec<Got> {
        self.book.lock().unwrap().got.clone()
    }

    /// The requests answered 2xx.
    pub fn delivered(&self) -> Vec<Got> {
        self.got()
            .into_iter()
            .filter(|g| g.status.is_some_and(|s| (200..300).contains(&s)))
            .collect()
    }
}

async fn receive(
    State(book): State<Arc<Mutex<Book>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = {
        let mut book = book.lock().unwrap();
        let answer = book.script.pop_front().unwrap_or(Answer::Status(204));
        let status = match answer {
            Answer::Status(s) | Answer::With(s, _, _) => Some(s),
            Answer::Hang => None,
        };
        book.got.push(Got {
            path: uri.path().to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                .collect(),
            body: String::from_utf8_lossy(&body).into_owned(),
            at: Instant::now(),
            status,
        });
        answer
    };
    match answer {
        Answer::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
        Answer::With(s, name, value) => {
            (StatusCode::from_u16(s).unwrap(), [(name, value)]).into_response()
        }
        Answer::Hang => std::future::pending().await,
    }
}

/// What `standardwebhooks.Webhook(secret).verify(body, headers)` says of each request:
/// the event's type, or why it refused it.
pub fn verify(secret: &str, got: &[Got]) -> Vec<Result<String, String>> {
    let python = std::env::var("CHECKOUT_TEST_WEBHOOKS_PYTHON").expect(
        "CHECKOUT_TEST_WEBHOOKS_PYTHON names a Python with standardwebhooks (scripts/test installs it)",
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/webhooks/verify.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the verifier");
    let mut stdin = child.stdin.take().unwrap();
    for g in got {
        let line = serde_json::json!({"secret": secret, "headers": g.headers, "body": g.body});
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().expect("the verifier's verdicts");
    assert!(out.status.success(), "the verifier failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            if v["ok"] == true {
                Ok(v["type"].as_str().unwrap().to_owned())
            } else {
                Err(v["error"].as_str().unwrap().to_owned())
            }
        })
        .collect()
}
