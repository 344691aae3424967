//! One worker's budget of request bytes held in memory (--max-request-memory), shared by the
//! Python loop and the native loops' threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;

/// A flood that held this much, or passed this much through, and then let go is worth a
/// malloc_trim() (refork.http.budget: TRIM_AFTER, CHURN_TRIM).
const TRIM_AFTER: usize = 8 << 20;
const CHURN_TRIM: usize = 4 << 20;

/// One worker's budget of request bytes held in memory while they arrive, over all its
/// connections: the Python loop's (refork.http.budget.MemoryBudget, the same interface, through
/// `MemoryBudget`) and the native loops' threads share it.
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    /// bytes charged or noted since the last ebb
    churn: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes (0: no cap).
    pub fn new(limit: usize) -> Budget {
        let limit = if limit == 0 { usize::MAX / 4 } else { limit };
        Budget { limit, used: AtomicUsize::new(0), peak: AtomicUsize::new(0), churn: AtomicUsize::new(0) }
    }

    /// Charge n bytes if they fit; false, with nothing charged, when they do not.
    pub fn take(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used + n > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(used, used + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(used + n, Ordering::Relaxed);
                    self.churn.fetch_add(n, Ordering::Relaxed);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    /// Charge n bytes held already, whether they fit or not.
    pub fn charge(&self, n: usize) {
        let used = self.used.fetch_add(n, Ordering::AcqRel) + n;
        self.peak.fetch_max(used, Ordering::Relaxed);
        self.churn.fetch_add(n, Ordering::Relaxed);
    }

    pub fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// refork.http.budget.MemoryBudget for the native loops: one worker's `Budget`, shared by the
/// Python loop (which calls these methods) and the engines' threads.
#[pyclass(module = "refork._native", frozen)]
pub struct MemoryBudget {
    pub(crate) inner: Arc<Budget>,
}

#[pymethods]
impl MemoryBudget {
    /// MemoryBudget(limit): 0 is no cap.
    #[new]
    fn new(limit: usize) -> Self {
        MemoryBudget { inner: Arc::new(Budget::new(limit)) }
    }

    fn take(&self, n: usize) -> bool {
        self.inner.take(n)
    }

    fn charge(&self, n: usize) {
        self.inner.charge(n)
    }

    fn give_back(&self, n: usize) {
        self.inner.give_back(n)
    }

    /// n bytes went through a connection's buffers without being charged (refused at once).
    fn note(&self, n: usize) {
        self.inner.churn.fetch_add(n, Ordering::Relaxed);
    }

    #[getter]
    fn limit(&self) -> usize {
        self.inner.limit
    }

    #[getter]
    fn used(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    #[getter]
    fn peak(&self) -> usize {
        self.inner.peak.load(Ordering::Acquire)
    }

    /// True (once) when the bytes held fell to a quarter of their peak after a flood (a peak of
    /// 8 MiB, or 4 MiB through the buffers): the moment for a malloc_trim()
    /// (refork.http.budget.MemoryBudget.ebbed).
    fn ebbed(&self) -> bool {
        let peak = self.inner.peak.load(Ordering::Acquire);
        let used = self.inner.used.load(Ordering::Acquire);
        if (peak < TRIM_AFTER && self.inner.churn.load(Ordering::Acquire) < CHURN_TRIM) || used * 4 > peak {
            return false;
        }
        self.inner.peak.store(used, Ordering::Release);
        self.inner.churn.store(0, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_refuses_past_the_limit_charge_does_not() {
        let b = Budget::new(100);
        assert!(b.take(60) && b.take(40));
        assert!(!b.take(1));
        b.charge(10); // bytes held already: counted whether they fit or not
        assert_eq!(b.used.load(Ordering::Acquire), 110);
        b.give_back(110);
        assert!(b.take(100));
        assert_eq!(b.peak.load(Ordering::Acquire), 110);
    }

    #[test]
    fn no_cap() {
        let b = Budget::new(0);
        assert!(b.take(1 << 40));
    }

    #[test]
    fn ebbed_once_a_flood_fell_to_a_quarter_of_its_peak() {
        let m = MemoryBudget::new(0);
        m.charge(TRIM_AFTER);
        assert!(!m.ebbed()); // still held
        m.give_back(TRIM_AFTER - TRIM_AFTER / 4);
        assert!(m.ebbed());
        assert!(!m.ebbed()); // once
        // a small peak is not worth a trim, unless that many bytes went through
        let m = MemoryBudget::new(0);
        m.charge(1000);
        m.give_back(1000);
        assert!(!m.ebbed());
        m.note(CHURN_TRIM);
        assert!(m.ebbed());
    }
}
