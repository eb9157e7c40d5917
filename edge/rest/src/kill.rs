//! Stopping what the endpoint started: a script call that runs past the
//! endpoint's deadline holds Redis (every other caller gets `BUSY`), and `SCRIPT
//! KILL` is rightly not a client's command. So the endpoint sends it itself, on a
//! connection of its own (the script's connection waits behind the script), and
//! tells the caller what became of the script: stopped, or — when it has
//! written — not stoppable (`UNKILLABLE`: Redis answers `BUSY` until it ends).
//!
//! Redis takes the kill only once the script has run past its own
//! `busy-reply-threshold` (5 s by default), so the kill waits for its answer
//! (and for the script to end), [`KILL_WAIT`] at most.

use std::time::Duration;

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{RedisErrorKind, Store as _, StoreError, StoreErrorKind, StoreOptions};

/// How long the endpoint waits for Redis to answer its `SCRIPT KILL`.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

/// What runs a script on Redis, and the command that stops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runner {
    /// `EVAL`, `EVALSHA` and their `_RO` forms: `SCRIPT KILL`.
    Script,
    /// `FCALL`, `FCALL_RO`: `FUNCTION KILL`.
    Function,
}

impl Runner {
    /// The runner of a command, if it runs a script.
    fn of(command: &[Vec<u8>]) -> Option<Self> {
        let name = command.first()?;
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("EVAL") || is("EVALSHA") || is("EVAL_RO") || is("EVALSHA_RO") {
            Some(Runner::Script)
        } else if is("FCALL") || is("FCALL_RO") {
            Some(Runner::Function)
        } else {
            None
        }
    }

    /// The first runner among `commands` (a batch's), if any runs a script.
    pub(crate) fn in_batch(commands: &[Vec<Vec<u8>>]) -> Option<Self> {
        commands.iter().find_map(|c| Self::of(c))
    }

    fn kill(self) -> [&'static [u8]; 2] {
        match self {
            Runner::Script => [b"SCRIPT", b"KILL"],
            Runner::Function => [b"FUNCTION", b"KILL"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Runner::Script => "SCRIPT KILL",
            Runner::Function => "FUNCTION KILL",
        }
    }
}

/// Why a request's Redis call gave it no reply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallFailure {
    /// Redis could not be asked, or did not answer in time.
    #[error("ERR redis unavailable: {}", .0.message)]
    Store(StoreError),
    /// A script ran past the deadline, and the endpoint stopped it.
    #[error(
        "ERR the script ran past this endpoint's deadline of {} ms and was stopped ({})",
        .deadline.as_millis(), .runner.name()
    )]
    Stopped { deadline: Duration, runner: Runner },
    /// A script ran past the deadline after writing: Redis cannot stop it.
    #[error(
        "ERR the script ran past this endpoint's deadline of {} ms after it wrote, so Redis \
         refuses to stop it ({}: UNKILLABLE) and answers BUSY until the script ends",
        .deadline.as_millis(), .runner.name()
    )]
    Unkillable { deadline: Duration, runner: Runner },
}

/// The endpoint's own connection for stopping scripts.
pub(crate) struct Killer {
    conn: RespStore,
    /// One kill at a time (a second waits, then finds the next script, or none).
    one: tokio::sync::Mutex<()>,
}

impl Killer {
    /// Connects the endpoint's own connection (the pool's options, a longer wait).
    pub(crate) async fn connect(options: &StoreOptions) -> Result<Self, StoreError> {
        let mut options = options.clone();
        options.deadline = KILL_WAIT;
        Ok(Killer {
            conn: RespStore::connect_with(&options).await?,
            one: tokio::sync::Mutex::new(()),
        })
    }

    /// Sends the kill; once Redis took it, waits for the script to end, so that
    /// Redis serves again when the caller is answered: the kill only flags the
    /// script, which stops at its next check.
    async fn kill(&self, runner: Runner) -> Result<(), StoreError> {
        self.conn.command(&runner.kill()).await?;
        while let Err(e) = self.conn.command(&[b"PING"]).await {
            if e.kind != StoreErrorKind::Redis(RedisErrorKind::Busy) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// The failure to answer for a call of `commands` that failed with `e`: when
    /// it timed out running a script, the script is stopped first.
    pub(crate) async fn after(
        &self,
        commands: &[Vec<Vec<u8>>],
        e: StoreError,
        deadline: Duration,
    ) -> CallFailure {
        let runner = match Runner::in_batch(commands) {
            Some(r) if e.kind == StoreErrorKind::Timeout => r,
            _ => return CallFailure::Store(e),
        };
        // bounded whole, waiting for another caller's kill included (a Redis that
        // answers nothing at all must not queue the callers up behind each other)
        let killed = tokio::time::timeout(KILL_WAIT, async {
            let _one = self.one.lock().await;
            self.kill(runner).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer within {KILL_WAIT:?}"),
            ))
        });
        match killed {
            Ok(_) => CallFailure::Stopped { deadline, runner },
            Err(k) if k.kind == StoreErrorKind::Redis(RedisErrorKind::Unkillable) => {
                tracing::warn!(
                    target: "floodgate::rest",
                    "a script ran past the deadline of {deadline:?} after writing: Redis \
                     refuses {} (UNKILLABLE) and answers BUSY until the script ends",
                    runner.name()
                );
                CallFailure::Unkillable { deadline, runner }
            }
            // it ended meanwhile: the call was only slow
            Err(k) if k.kind == StoreErrorKind::Redis(RedisErrorKind::NotBusy) => {
                CallFailure::Store(e)
            }
            Err(k) => {
                tracing::warn!(
                    target: "floodgate::rest",
                    error = %k,
                    "a script ran past the deadline of {deadline:?}; {} failed: {k}",
                    runner.name()
                );
                CallFailure::Store(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn script_calls_are_told_from_other_commands() {
        for (words, runner) in [
            (&["EVAL", "return 1", "0"][..], Some(Runner::Script)),
            (&["evalsha_ro", "abc", "0"], Some(Runner::Script)),
            (&["EvalSha", "abc", "0"], Some(Runner::Script)),
            (&["FCALL", "f", "0"], Some(Runner::Function)),
            (&["fcall_ro", "f", "0"], Some(Runner::Function)),
            (&["GET", "EVAL"], None),
            (&["SCRIPT", "LOAD", "return 1"], None),
        ] {
            assert_eq!(Runner::of(&command(words)), runner, "{words:?}");
        }
        let batch = [
            command(&["MULTI"]),
            command(&["SET", "k", "v"]),
            command(&["FCALL", "f", "0"]),
        ];
        assert_eq!(Runner::in_batch(&batch), Some(Runner::Function));
        assert_eq!(Runner::in_batch(&batch[..2]), None);
        assert_eq!(Runner::in_batch(&[]), None);
    }
}
