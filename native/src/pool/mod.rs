//! The connection loop of a WSGI worker with a pool of app threads (`--threads N`), in Rust.
//!
//! One **I/O thread** (pool/io.rs), which never takes the GIL, owns the idle and arriving
//! connections: epoll, accept, recv, the common request shape parsed with httparse, bodies up to
//! the in-memory threshold, the deadlines, the writes a client is slow to take, the --static
//! answers the static cache holds (pool/io.rs `replay_static`). A complete request becomes a job
//! in the queue below, with its connection. The **app threads** are the worker's
//! Python threads (refork.serving.wsgi.pool_host): each runs `work()`, which waits for a job with
//! the GIL released, then builds the environ, calls the app, frames the whole body (pool/serve.rs)
//! and writes it with one `send`; the connection then goes back to the I/O thread's epoll
//! (EPOLLONESHOT: the app thread re-arms it, the I/O thread is not woken), or the same app thread
//! serves what the client pipelined behind it. So an idle or slow connection costs no thread, and
//! a request costs no GIL hand-off to an I/O loop.
//!
//! Connections the Python loop served come back between two requests (`adopt`).
//!
//! Anything else goes to the Python loop (refork.serving.wsgi.python_loop, through the wake-up eventfd
//! it polls and `take()`), with its connection, from the first byte of the message: the Python
//! parser then gives every verdict, as with the single-thread engine (engine/). The Python
//! loop's own jobs (a chunked upload, say) run on the same app threads (`submit`).
//!
//! Forks: the I/O thread is joined (`pause`) before a safe point and started again after it; the
//! app threads are Python threads the Python loop joins. A promoted worker's child forgets every
//! connection (`release_after_fork`), so the new mold holds no thread and no loop state.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

mod io;
mod serve;

use crate::conn::handed::Handed;
use crate::conn::intake::Intake;
use crate::conn::lingering::Lingering;
use crate::host::{Host, Refs};
use crate::conn::Conn;
use crate::http::head::HeadLimits;
use crate::sys;
use crate::wsgi::accounting::SlotClock;
use crate::wsgi::environ::Environ;
use crate::wsgi::start_response::Hooks;

pub(crate) const IN: u32 = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
pub(crate) const OUT: u32 = (libc::EPOLLOUT | libc::EPOLLONESHOT) as u32;

pub(crate) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) enum Job {
    /// a connection whose buffer starts with a complete request of the common shape
    Request(Conn),
    /// the Python loop's job: the arguments of its handler (refork.serving.wsgi.python_loop.PythonLoop._pool_job)
    Python(Py<PyAny>),
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// requests held while the worker waits for a safe point (`hold`)
    parked: Vec<Conn>,
    /// app threads asked to return from work()
    stops: usize,
    /// native requests in `jobs`, and being served by app threads
    queued: usize,
    serving: usize,
    /// jobs of either kind given to the app threads and not done (parked ones too): at
    /// `Shared::threads`, no thread is free and the I/O thread accepts nothing
    busy: usize,
    /// app threads blocked waiting for a job (no wake-up call when there are none)
    waiting: usize,
}

/// What an app thread takes from the queue.
enum Taken {
    Job(Job),
    /// return from work()
    Stop,
    /// nothing now (a look that does not block)
    Empty,
}

/// What the Python loop is told (under the wake-up eventfd it polls).
#[derive(Default)]
struct ToPython {
    /// connections handed over, with their bytes not consumed
    handed: Vec<(Conn, Vec<u8>)>,
    /// log lines: (is an error, message)
    notices: Vec<(bool, String)>,
}

/// What the I/O thread, the app threads and the Python loop share.
pub(crate) struct Shared {
    /// the I/O thread's epoll (app threads re-arm the connections they give back)
    ep: sys::Epoll,
    /// wakes the I/O thread (to pause)
    io_wake: sys::EventFd,
    /// wakes the Python loop (connections handed over, log lines)
    py_wake: sys::EventFd,
    queue: Mutex<Queue>,
    ready: Condvar,
    /// connections app threads gave back (armed in `ep` after they are pushed here)
    returned: Mutex<Vec<Conn>>,
    to_python: Mutex<ToPython>,
    /// connections closed lingering (conn/lingering.rs): in `ep` for reads, counted in `open`
    /// until the I/O thread closes them
    lingering: Mutex<Lingering>,
    pause: AtomicBool,
    holding: AtomicBool,
    /// the app threads' count (`busy` reaching it stops accepts)
    threads: usize,
    /// the I/O thread stopped accepting for want of a free thread: the app thread that frees one
    /// wakes it
    full: AtomicBool,
    /// the shared word where the monitor counts the server's free app threads (0: no such word)
    free_elsewhere: usize,
    /// False once the worker stops (or from the start, with --keepalive 0): every response says
    /// "Connection: close"
    keep_alive: AtomicBool,
    /// connections the engine owns, wherever they are (the drain waits for 0)
    open: AtomicUsize,
    /// the sockets of the requests in the app (a worker aborted past --timeout answers them)
    in_app: Mutex<Vec<i32>>,
    intake: Intake,
}

impl Shared {
    /// A request is complete: to an app thread (or parked while the worker waits for a safe point).
    fn dispatch(&self, conn: Conn) {
        let mut q = locked(&self.queue);
        q.busy += 1;
        if self.holding.load(Ordering::Acquire) {
            q.parked.push(conn);
            return;
        }
        q.jobs.push_back(Job::Request(conn));
        q.queued += 1;
        self.wake_one(q);
    }

    /// Wake an app thread that waits for a job, if one does.
    fn wake_one(&self, q: MutexGuard<'_, Queue>) {
        let waiting = q.waiting > 0;
        drop(q);
        if waiting {
            self.ready.notify_one();
        }
    }

    /// The next job for an app thread; `block`: wait for one (else Empty when there is none).
    fn take(&self, block: bool) -> Taken {
        let mut q = locked(&self.queue);
        loop {
            if q.stops > 0 {
                q.stops -= 1;
                return Taken::Stop;
            }
            if let Some(mut job) = q.jobs.pop_front() {
                if let Job::Request(conn) = &mut job {
                    conn.release(); // an app thread has it: not waiting any more
                    q.queued -= 1;
                    q.serving += 1;
                }
                return Taken::Job(job);
            }
            if !block {
                return Taken::Empty;
            }
            q.waiting += 1;
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            q.waiting -= 1;
        }
    }

    /// App threads free now (none: accept nothing).
    fn free(&self) -> usize {
        self.threads.saturating_sub(locked(&self.queue).busy)
    }

    /// Another worker has an app thread free, as the monitor last counted (this worker's being
    /// all busy, the count is theirs): then a worker with none free steps aside.
    fn free_elsewhere(&self) -> bool {
        if self.free_elsewhere == 0 {
            return false;
        }
        // SAFETY: an aligned 8-byte word of a MAP_SHARED page the worker keeps mapped for its
        // life (refork.process.readiness), written by the monitor with plain 8-byte stores.
        let word = unsafe { &*(self.free_elsewhere as *const std::sync::atomic::AtomicI64) };
        word.load(Ordering::Relaxed) > 0
    }

    /// A job is done (`native`: a request of the engine's): a thread is free again; if the I/O
    /// thread stopped accepting for want of one, wake it.
    fn done(&self, native: bool) {
        let mut q = locked(&self.queue);
        if native {
            q.serving -= 1;
        }
        q.busy -= 1;
        drop(q);
        if self.full.load(Ordering::Acquire) {
            self.io_wake.notify();
        }
    }

    /// An app thread is done with a connection: the I/O thread's again, waiting for `events`.
    /// Armed under the lock the I/O thread takes before it looks for the connection of an event,
    /// so it finds it there.
    fn give_back(&self, conn: Conn, events: u32) {
        let mut returned = locked(&self.returned);
        if self.ep.modify(conn.fd, events).is_err() {
            drop(returned);
            self.close(conn);
            return;
        }
        returned.push(conn);
    }

    fn close(&self, conn: Conn) {
        self.close_fd(conn.fd);
    }

    fn close_fd(&self, fd: i32) {
        sys::close(fd);
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Close a connection the engine is done with lingering (conn/lingering.rs): what its client
    /// still sends is dropped by the I/O thread, never answered with a reset. Kept before it is
    /// armed, so the I/O thread finds it.
    fn end(&self, conn: Conn) {
        let mut lingering = locked(&self.lingering);
        if lingering.begin(conn.fd, sys::monotonic()) {
            if self.ep.modify(conn.fd, IN).is_ok() {
                return;
            }
            lingering.forget(conn.fd);
        }
        drop(lingering);
        self.close(conn);
    }

    /// The connection is the Python loop's from `data` (its bytes not consumed) on. It counts as
    /// the engine's until the Python loop takes it (`take`), so a draining loop always finds it somewhere.
    fn hand_over(&self, mut conn: Conn, data: Vec<u8>) {
        self.ep.delete(conn.fd);
        conn.hold(&self.intake.memory, data.len(), true); // (counted until the Python loop read it)
        locked(&self.to_python).handed.push((conn, data));
        self.py_wake.notify();
    }
}

/// Where the I/O thread counts the --static answers it replays (pool/io.rs), or None: it replays
/// none, when something else must see their requests (the access log, pre_request) or the worker
/// has no slot clock.
fn static_counter(py: Python<'_>, host: &Host, hooks: &Hooks) -> PyResult<Option<SlotClock>> {
    let Some(clock) = host.control.clock.as_ref().filter(|_| host.access_log.is_none() && hooks.pre_request.is_none()) else {
        return Ok(None);
    };
    let words = clock.bind(py).call_method0(pyo3::intern!(py, "native_words"))?;
    Ok(Some(SlotClock::new(words.cast::<pyo3::types::PyDict>()?)?))
}

/// A line for the worker's log, written by the Python loop.
pub(crate) fn log_notice(shared: &Shared, error: bool, message: String) {
    locked(&shared.to_python).notices.push((error, message));
    shared.py_wake.notify();
}

/// What the app threads call in Python (the GIL held).
pub(crate) struct AppSide {
    host: Host,
    refs: Refs,
    environs: Vec<Py<Environ>>,
    /// the listening fds, in the order of `environs`
    listener_fds: Vec<i32>,
    hooks: Py<Hooks>,
    limits: HeadLimits,
}

#[pyclass(module = "refork._native", frozen)]
pub struct PoolEngine {
    shared: Arc<Shared>,
    side: AppSide,
    /// the I/O thread's state while it is not running (before start, at a safe point, at the end)
    io: Mutex<Option<io::Io>>,
    thread: Mutex<Option<JoinHandle<io::Io>>>,
}

#[pymethods]
impl PoolEngine {
    /// PoolEngine(host, listeners, refs): as Engine's (engine/); `host` also has
    /// finish_response(...) -> keep, which sends a response this engine does not frame.
    #[new]
    fn new(py: Python<'_>, host: Host, listeners: Vec<(i32, Py<Environ>)>, refs: Refs) -> PyResult<Self> {
        let ep = sys::Epoll::new()?;
        let io_wake = sys::EventFd::new()?;
        ep.add(io_wake.fd, libc::EPOLLIN as u32)?;
        for (fd, _) in &listeners {
            ep.add(*fd, libc::EPOLLIN as u32)?;
        }
        let intake = Intake::new(&host, py)?;
        let settings = &host.settings;
        let shared = Arc::new(Shared {
            ep,
            io_wake,
            py_wake: sys::EventFd::new()?,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            returned: Mutex::new(Vec::new()),
            to_python: Mutex::new(ToPython::default()),
            lingering: Mutex::new(Lingering::default()),
            pause: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            threads: settings.threads,
            full: AtomicBool::new(false),
            free_elsewhere: host.control.free_threads_address.bind(py).call0()?.extract()?,
            keep_alive: AtomicBool::new(host.keep_alive),
            open: AtomicUsize::new(0),
            in_app: Mutex::new(Vec::new()),
            intake,
        });
        let hooks = Hooks::new(py, &host, &refs);
        let timeout_response = refs.timeout_response.bind(py).as_bytes().to_vec();
        let statics = static_counter(py, &host, &hooks)?;
        let io = io::Io::new(shared.clone(), listeners.iter().map(|(fd, _)| *fd).collect(), settings.timeouts, timeout_response, statics);
        let side = AppSide {
            listener_fds: listeners.iter().map(|(fd, _)| *fd).collect(),
            environs: listeners.into_iter().map(|(_, environ)| environ).collect(),
            hooks: Py::new(py, hooks)?,
            limits: settings.limits,
            host,
            refs,
        };
        Ok(PoolEngine { shared, side, io: Mutex::new(Some(io)), thread: Mutex::new(None) })
    }

    /// Start the I/O thread (again, after `pause`).
    fn start(&self) -> PyResult<()> {
        let Some(io) = locked(&self.io).take() else {
            return Ok(()); // running
        };
        let handle = std::thread::Builder::new()
            .name("refork-io".into())
            .spawn(move || io.run())
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the I/O thread: {e}")))?;
        *locked(&self.thread) = Some(handle);
        Ok(())
    }

    /// Stop the I/O thread and join it (nothing of the engine runs until `start`).
    fn pause(&self, py: Python<'_>) -> PyResult<()> {
        let Some(handle) = locked(&self.thread).take() else {
            return Ok(());
        };
        self.shared.pause.store(true, Ordering::Release);
        self.shared.io_wake.notify();
        let joined = py.detach(|| handle.join());
        self.shared.pause.store(false, Ordering::Release);
        let io = joined.map_err(|_| PyRuntimeError::new_err("the I/O thread panicked"))?;
        *locked(&self.io) = Some(io);
        Ok(())
    }

    /// A connection of `listener_fd` the Python loop gives back between two requests (see
    /// refork.serving.wsgi.native_host.NativeHost.take_back): the I/O thread's again.
    fn adopt(&self, fd: i32, client: Bound<'_, PyAny>, listener_fd: i32, since: f64) -> PyResult<()> {
        let environ = self.side.listener_fds.iter().position(|&l| l == listener_fd).ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a listener of the engine"))?;
        let conn = Conn::adopted(fd, &client, listener_fd, environ, since)?;
        let mut returned = locked(&self.shared.returned);
        if let Err(e) = self.shared.ep.add(fd, IN) {
            sys::close(fd);
            return Err(e.into());
        }
        self.shared.open.fetch_add(1, Ordering::AcqRel);
        returned.push(conn);
        Ok(())
    }

    /// An app thread's life: serve jobs until stop_workers() tells it to return. Python jobs go
    /// to `handler(*job)`; an exception that is not an Exception (SystemExit...) is raised here.
    /// The GIL is let go only to wait for a job: a thread that finds one waiting keeps it (no
    /// hand-off to another app thread and back).
    fn work(&self, py: Python<'_>, handler: Bound<'_, PyAny>) -> PyResult<()> {
        loop {
            let taken = match self.shared.take(false) {
                Taken::Empty => {
                    let shared = self.shared.clone();
                    py.detach(move || shared.take(true))
                }
                taken => taken,
            };
            let job = match taken {
                Taken::Job(job) => job,
                _ => return Ok(()),
            };
            match job {
                Job::Python(args) => {
                    let result = handler.call1(args.bind(py).cast::<PyTuple>()?);
                    self.shared.done(false);
                    result?;
                }
                Job::Request(conn) => {
                    let result = self.serve(py, conn);
                    self.shared.done(true);
                    result?;
                }
            }
        }
    }

    /// A job of the Python loop for the app threads (see `work`).
    fn submit(&self, job: Bound<'_, PyTuple>) {
        let mut q = locked(&self.shared.queue);
        q.busy += 1;
        q.jobs.push_back(Job::Python(job.into_any().unbind()));
        self.shared.wake_one(q);
    }

    /// Make `count` app threads return from work().
    fn stop_workers(&self, count: usize) {
        locked(&self.shared.queue).stops += count;
        self.shared.ready.notify_all();
    }

    /// The worker waits for a safe point: hold new requests (not started ones) until hold(False).
    fn hold(&self, on: bool) {
        if self.shared.holding.swap(on, Ordering::AcqRel) == on || on {
            return;
        }
        let mut q = locked(&self.shared.queue);
        let parked = std::mem::take(&mut q.parked);
        q.queued += parked.len();
        q.jobs.extend(parked.into_iter().map(Job::Request));
        drop(q);
        self.shared.ready.notify_all();
    }

    /// Native requests queued or in the app (a safe point waits for 0).
    #[getter]
    fn in_flight(&self) -> usize {
        let q = locked(&self.shared.queue);
        q.queued + q.serving
    }

    /// The sockets of the requests in the app now, for a worker aborted past --timeout: their
    /// app threads cannot be interrupted, the worker answers them (500) before it exits.
    #[getter]
    fn in_app(&self) -> Vec<i32> {
        locked(&self.shared.in_app).clone()
    }

    /// App threads free now, for the jobs of either loop (the Python loop accepts on its own
    /// listeners only while one is).
    #[getter]
    fn free_threads(&self) -> usize {
        self.shared.free()
    }

    /// No connection is left (a draining worker may stop).
    #[getter]
    fn idle(&self) -> bool {
        self.shared.open.load(Ordering::Acquire) == 0
    }

    /// The eventfd the Python loop polls: then call take().
    #[getter]
    fn wake_fd(&self) -> i32 {
        self.shared.py_wake.fd
    }

    /// (the connections handed over (conn/handed.rs), log lines as (is an error, message)).
    fn take<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        self.shared.py_wake.drain();
        let told = std::mem::take(&mut *locked(&self.shared.to_python));
        self.shared.open.fetch_sub(told.handed.len(), Ordering::AcqRel); // (the caller adopts them now)
        let handed = PyList::empty(py);
        let memory = &self.shared.intake.memory;
        for (mut conn, data) in told.handed {
            handed.append(Handed::new(py, &mut conn, memory, &data)?)?;
        }
        Ok((handed, PyList::new(py, told.notices)?))
    }

    /// The worker stops: accept no more (`take_backlog`: the whole server stops, so first accept
    /// every connection queued in the backlog); responses say "Connection: close"; idle
    /// connections close at `drain_until` (a fresh one keeps its keep-alive clock).
    fn drain(&self, py: Python<'_>, drain_until: f64, take_backlog: bool) -> PyResult<()> {
        self.pause(py)?;
        self.shared.keep_alive.store(false, Ordering::Release);
        if let Some(io) = locked(&self.io).as_mut() {
            io.drain(drain_until, take_backlog);
        }
        self.start()
    }

    /// In a child forked at a safe point: every connection is the parent's (see
    /// refork.serving.connection.release_after_fork); forget them all, and the listeners.
    fn release_after_fork(&self) {
        let mut fds: Vec<i32> = Vec::new();
        if let Some(io) = locked(&self.io).as_mut() {
            fds.extend(io.forget());
        }
        fds.extend(locked(&self.shared.returned).drain(..).map(|c| c.fd));
        fds.extend(locked(&self.shared.lingering).take_all());
        fds.extend(locked(&self.shared.to_python).handed.drain(..).map(|(c, _)| c.fd));
        let mut q = locked(&self.shared.queue);
        fds.extend(q.parked.drain(..).map(|c| c.fd));
        for job in q.jobs.drain(..) {
            if let Job::Request(c) = job {
                fds.push(c.fd);
            }
        }
        *q = Queue::default();
        drop(q);
        sys::release(fds.into_iter());
        self.shared.open.store(0, Ordering::Release);
    }

    /// The worker is done: stop the I/O thread, close every connection not in an app thread.
    fn close_all(&self, py: Python<'_>) -> PyResult<()> {
        self.pause(py)?;
        let mut conns: Vec<Conn> = Vec::new();
        if let Some(io) = locked(&self.io).as_mut() {
            conns.extend(io.take_all());
        }
        conns.extend(locked(&self.shared.returned).drain(..));
        conns.extend(locked(&self.shared.to_python).handed.drain(..).map(|(c, _)| c));
        {
            let mut q = locked(&self.shared.queue);
            q.busy -= q.parked.len();
            conns.append(&mut q.parked);
            let jobs = std::mem::take(&mut q.jobs);
            for job in jobs {
                match job {
                    Job::Request(c) => {
                        q.queued -= 1;
                        q.busy -= 1;
                        conns.push(c);
                    }
                    other => q.jobs.push_back(other),
                }
            }
        }
        for conn in conns {
            self.shared.close(conn);
        }
        let lingering = locked(&self.shared.lingering).take_all();
        for fd in lingering {
            self.shared.close_fd(fd);
        }
        Ok(())
    }
}
