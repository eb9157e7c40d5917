//! A store over a real one whose script calls fail when a test says so: a call
//! that breaks partway through a group, a crash between two writes.

use std::sync::atomic::{AtomicUsize, Ordering};

use floodgate_edge::store::{Store, StoreError, StoreErrorKind, Value};
use floodgate_shared::script::LuaScript;

/// Which script calls fail: given the script and the call's number (from 1).
type Rule = Box<dyn Fn(&LuaScript, usize) -> bool + Send + Sync>;

/// `inner`, but for the script calls `rule` picks, which fail as a reset
/// connection would (nothing reaches the server).
pub struct Faulty<S> {
    pub inner: S,
    calls: AtomicUsize,
    rule: std::sync::Mutex<Rule>,
}

impl<S> Faulty<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: AtomicUsize::new(0),
            rule: std::sync::Mutex::new(Box::new(|_, _| false)),
        }
    }

    /// The script calls made so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// From now on, the calls `rule` picks fail.
    pub fn fail(&self, rule: impl Fn(&LuaScript, usize) -> bool + Send + Sync + 'static) {
        *self.rule.lock().unwrap() = Box::new(rule);
    }
}

impl<S: Store + Sync> Store for &Faulty<S> {
    async fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if (self.rule.lock().unwrap())(script, n) {
            return Err(StoreError::new(
                StoreErrorKind::Connect,
                "connection reset (injected)",
            ));
        }
        self.inner.run(script, keys, args).await
    }

    async fn command(&self, args: &[&[u8]]) -> Result<Value, StoreError> {
        self.inner.command(args).await
    }

    async fn pipeline(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        self.inner.pipeline(commands).await
    }
}
