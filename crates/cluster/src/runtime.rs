//! openraft's runtime for Warren's groups: tokio's in every respect but one, its randomness
//! (the election timeouts), which comes from a generator a deterministic simulation seeds
//! ([`seed_rng`]), so that one seed replays one run. Outside a simulation the generator is
//! seeded from the OS, as tokio's runtime's is.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant, TokioRuntime};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static RNG: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Seeds this thread's generator: a simulation runs every node on one thread.
pub fn seed_rng(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

fn with<T>(f: impl FnOnce(&mut StdRng) -> T) -> T {
    RNG.with(|r| f(r.borrow_mut().get_or_insert_with(StdRng::from_entropy)))
}

/// This thread's generator.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rng;

impl RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        with(|r| r.next_u32())
    }
    fn next_u64(&mut self) -> u64 {
        with(|r| r.next_u64())
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        with(|r| r.fill_bytes(dest))
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        with(|r| r.try_fill_bytes(dest))
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct WarrenRuntime;

impl AsyncRuntime for WarrenRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = Rng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }
    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }
    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }
    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }
    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }
    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }
    fn thread_rng() -> Self::ThreadLocalRng {
        Rng
    }
    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng as _;

    #[test]
    fn a_seed_gives_the_same_draws() {
        seed_rng(7);
        let a: Vec<u64> = (0..4).map(|_| Rng.gen_range(150..300)).collect();
        seed_rng(7);
        let b: Vec<u64> = (0..4).map(|_| Rng.gen_range(150..300)).collect();
        seed_rng(8);
        let c: Vec<u64> = (0..4).map(|_| Rng.gen_range(150..300)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
