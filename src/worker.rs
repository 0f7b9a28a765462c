//! Background workers, of one shape: a value that does its work in `run(self)` for as
//! long as the service runs, and [`every`] for those that tick. [`Workers`] holds them
//! and tells `App::serve` when one ends: a worker that ends (or panics) while the service
//! runs is a fault (mail or recovery would stop without a word), so the service logs it
//! at error level and stops with a non-zero status, for its supervisor to restart it.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinSet};

/// A background worker: `run` never returns while all is well.
pub trait Worker: Send + 'static {
    /// What the log says when it ends.
    const NAME: &'static str;

    fn run(self) -> impl Future<Output = ()> + Send;
}

/// Runs `tick` every `period`, for ever: the first at once, the next `period` after the
/// previous one began (or ended, when it took longer: a slow tick is not made up for).
/// A tick's failure is its own to log; the next tick comes all the same.
pub async fn every<F, Fut>(period: Duration, mut tick: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        tick().await;
    }
}

/// The running workers, by name.
#[derive(Default)]
pub struct Workers {
    tasks: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

/// How a worker ended.
#[derive(Debug, thiserror::Error)]
#[error(
    "the background worker `{name}` {how} while the service ran; the service stops so that it is restarted"
)]
pub struct Ended {
    pub name: &'static str,
    pub how: String,
}

impl Workers {
    pub fn spawn<W: Worker>(&mut self, worker: W) {
        let task = self.tasks.spawn(worker.run());
        self.names.insert(task.id(), W::NAME);
    }

    /// The first worker to end, and how; never, while none does (or none runs).
    pub async fn ended(&mut self) -> Ended {
        let Some(joined) = self.tasks.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, how) = match joined {
            Ok((id, ())) => (id, "ended".to_owned()),
            Err(err) => {
                let id = err.id();
                let how = match err.try_into_panic() {
                    Ok(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
                    Err(err) => format!("was cancelled: {err}"),
                };
                (id, how)
            }
        };
        Ended {
            name: self.names.remove(&id).unwrap_or("unnamed"),
            how,
        }
    }

    /// Aborts every worker and waits until each has stopped.
    pub async fn shutdown(&mut self) {
        self.tasks.shutdown().await;
        self.names.clear();
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panics;
    impl Worker for Panics {
        const NAME: &'static str = "panics";
        async fn run(self) {
            panic!("on purpose");
        }
    }

    struct Returns;
    impl Worker for Returns {
        const NAME: &'static str = "returns";
        async fn run(self) {}
    }

    struct Ticks;
    impl Worker for Ticks {
        const NAME: &'static str = "ticks";
        async fn run(self) {
            every(Duration::from_millis(1), || async {}).await;
        }
    }

    #[tokio::test]
    async fn the_first_worker_to_end_is_named_with_how_it_ended() {
        let mut workers = Workers::default();
        workers.spawn(Ticks);
        workers.spawn(Panics);
        let ended = workers.ended().await;
        assert_eq!(
            (ended.name, ended.how.as_str()),
            ("panics", "panicked: on purpose")
        );
        workers.spawn(Returns);
        let ended = workers.ended().await;
        assert_eq!((ended.name, ended.how.as_str()), ("returns", "ended"));
        workers.shutdown().await;
    }

    #[tokio::test]
    async fn no_worker_is_no_end() {
        let mut workers = Workers::default();
        let waited = tokio::time::timeout(Duration::from_millis(200), workers.ended()).await;
        assert!(waited.is_err());
    }
}
