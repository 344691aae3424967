//! `Parser`, the Python loop's drop-in for refork.http.parser.RequestParser: the common shape
//! read by `fast_head`, anything else handed from its first byte to the Python parser; and the
//! Python face of a head (its method as an interned str, its refork.http.events.Request).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use super::head::{fast_head, Head, HeadLimits};

pub(crate) fn fast_method<'py>(py: Python<'py>, m: &str) -> Option<&'py Bound<'py, PyString>> {
    Some(match m {
        "GET" => pyo3::intern!(py, "GET"),
        "HEAD" => pyo3::intern!(py, "HEAD"),
        "POST" => pyo3::intern!(py, "POST"),
        "PUT" => pyo3::intern!(py, "PUT"),
        "DELETE" => pyo3::intern!(py, "DELETE"),
        "PATCH" => pyo3::intern!(py, "PATCH"),
        "OPTIONS" => pyo3::intern!(py, "OPTIONS"),
        _ => return None,
    })
}

#[pyclass(module = "refork._native")]
pub struct Parser {
    head_limits: HeadLimits,
    body_left: u64,
    keep_alive: bool,
    closed: bool,
    /// The Python RequestParser of a message the fast path does not take (None: fast path).
    slow: Option<Py<PyAny>>,
    slow_factory: Py<PyAny>,
    limits: Py<PyAny>,
    request_cls: Py<PyAny>,
    body_cls: Py<PyAny>,
    eom: Py<PyAny>,
    parse_error: Py<PyAny>,
}

/// The refork.http.events.Request of a fast head (`cls` is that class).
pub(crate) fn request_object<'py>(py: Python<'py>, cls: &Bound<'py, PyAny>, head: &Head) -> PyResult<Bound<'py, PyAny>> {
    let method = fast_method(py, head.method).expect("a fast method").clone();
    let target = head.target;
    let url = PyBytes::new(py, target);
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(i) => (PyBytes::new(py, &target[..i]), PyBytes::new(py, &target[i + 1..])),
        None => (url.clone(), PyBytes::new(py, b"")),
    };
    let version = if head.http11 { pyo3::intern!(py, "1.1") } else { pyo3::intern!(py, "1.0") };
    let headers = PyList::empty(py);
    for (name, value) in &head.headers {
        let pair = PyTuple::new(py, [PyBytes::new(py, name), PyBytes::new(py, value)])?;
        headers.append(pair)?;
    }
    let cl: Py<PyAny> = match head.content_length {
        Some(n) => n.into_pyobject(py)?.into_any().unbind(),
        None => py.None(),
    };
    let args = PyTuple::new(
        py,
        [
            method.into_any(),
            url.into_any(),
            path.into_any(),
            query.into_any(),
            version.clone().into_any(),
            headers.into_any(),
            pyo3::types::PyBool::new(py, head.keep_alive).to_owned().into_any(),
            pyo3::types::PyBool::new(py, false).to_owned().into_any(),
            pyo3::types::PyBool::new(py, false).to_owned().into_any(),
            cl.into_bound(py),
        ],
    )?;
    cls.call1(args)
}

impl Parser {
    fn request<'py>(&self, py: Python<'py>, head: &Head) -> PyResult<Bound<'py, PyAny>> {
        request_object(py, self.request_cls.bind(py), head)
    }

    /// Hand `data` (from a message boundary) to a Python parser; its events join `events`.
    fn feed_slow(&mut self, py: Python<'_>, data: &[u8], events: &Bound<'_, PyList>) -> PyResult<()> {
        let slow = match &self.slow {
            Some(p) => p.clone_ref(py),
            None => {
                let p = self.slow_factory.bind(py).call1((self.limits.bind(py),))?.unbind();
                self.slow = Some(p.clone_ref(py));
                p
            }
        };
        let slow = slow.bind(py);
        let got = match slow.call_method1(pyo3::intern!(py, "feed"), (PyBytes::new(py, data),)) {
            Ok(got) => got,
            Err(err) => {
                // the requests completed before the bad bytes are answered first: ours, then its own
                if err.is_instance(py, self.parse_error.bind(py)) && events.len() > 0 {
                    let exc = err.value(py);
                    let before = exc.getattr(pyo3::intern!(py, "events"))?;
                    let all = PyList::empty(py);
                    for e in events.iter() {
                        all.append(e)?;
                    }
                    for e in before.try_iter()? {
                        all.append(e?)?;
                    }
                    exc.setattr(pyo3::intern!(py, "events"), all)?;
                }
                return Err(err);
            }
        };
        let mut keeps = true;
        for e in got.try_iter()? {
            let e = e?;
            if e.is_instance(self.request_cls.bind(py))? {
                keeps &= e.getattr(pyo3::intern!(py, "keep_alive"))?.is_truthy()?;
            }
            events.append(e)?;
        }
        if !keeps {
            self.closed = true; // it ignores what follows a closing request: keep it to say so
        } else if !slow.getattr(pyo3::intern!(py, "in_message"))?.is_truthy()? {
            if slow.getattr(pyo3::intern!(py, "upgraded"))?.is_none() {
                self.slow = None; // between requests: back to the fast path
            } else {
                self.closed = true; // a WebSocket handshake handed off: it keeps the bytes after it
            }
        }
        Ok(())
    }
}

#[pymethods]
impl Parser {
    /// Parser(limits, slow_factory, request_cls, body_cls, eom, parse_error): `limits` is a
    /// refork.http.head.Limits, `slow_factory(limits)` makes the Python RequestParser.
    #[new]
    fn new(
        py: Python<'_>,
        limits: Py<PyAny>,
        slow_factory: Py<PyAny>,
        request_cls: Py<PyAny>,
        body_cls: Py<PyAny>,
        eom: Py<PyAny>,
        parse_error: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(Parser {
            head_limits: HeadLimits::from_py(limits.bind(py))?,
            body_left: 0,
            keep_alive: true,
            closed: false,
            slow: None,
            slow_factory,
            limits,
            request_cls,
            body_cls,
            eom,
            parse_error,
        })
    }

    /// The connection is gone: let go of what the Python parser of a message holds
    /// (refork.http.parser.RequestParser.release); feed() returns nothing from now on.
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(p) = self.slow.take() {
            p.bind(py).call_method0(pyo3::intern!(py, "release"))?;
        }
        self.closed = true;
        self.body_left = 0;
        Ok(())
    }

    /// True from the first byte of a request until its EndOfMessage.
    #[getter]
    fn in_message(&self, py: Python<'_>) -> PyResult<bool> {
        if self.body_left > 0 {
            return Ok(true);
        }
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "in_message"))?.is_truthy(),
            None => Ok(false),
        }
    }

    /// What the Python parser of a message in progress holds of it (refork.http.parser's
    /// `buffered`); the fast path holds nothing between reads.
    #[getter]
    fn buffered(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "buffered"))?.extract(),
            None => Ok(0),
        }
    }

    /// Bytes of the head in progress (refork.http.parser's `head_held`).
    #[getter]
    fn head_held(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "head_held"))?.extract(),
            None => Ok(0),
        }
    }

    /// After a WebSocket handshake (a Python parser made with `hand_off_websocket`): the bytes
    /// that followed its head (refork.http.parser's `upgraded`); None before.
    #[getter]
    fn upgraded<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "upgraded")),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// Parse more bytes; return the events they complete, in order (ParseError as the Python parser).
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let events = PyList::empty(py);
        if self.slow.is_some() {
            if self.closed {
                let p = self.slow.as_ref().expect("slow").clone_ref(py);
                return Ok(p.bind(py).call_method1("feed", (PyBytes::new(py, data),))?.cast_into()?);
            }
            self.feed_slow(py, data, &events)?;
            return Ok(events);
        }
        if self.closed {
            return Ok(events);
        }
        let mut at = 0;
        while at < data.len() {
            if self.body_left > 0 {
                let take = (self.body_left as usize).min(data.len() - at);
                events.append(self.body_cls.bind(py).call1((PyBytes::new(py, &data[at..at + take]),))?)?;
                at += take;
                self.body_left -= take as u64;
                if self.body_left == 0 {
                    events.append(self.eom.bind(py))?;
                    if !self.keep_alive {
                        self.closed = true;
                        break;
                    }
                }
                continue;
            }
            let rest = &data[at..];
            match fast_head(&self.head_limits, rest) {
                Some(head) => {
                    events.append(self.request(py, &head)?)?;
                    at += head.len;
                    self.keep_alive = head.keep_alive;
                    match head.content_length {
                        Some(n) if n > 0 => self.body_left = n,
                        _ => {
                            events.append(self.eom.bind(py))?;
                            if !head.keep_alive {
                                self.closed = true;
                                break;
                            }
                        }
                    }
                }
                None => {
                    self.feed_slow(py, rest, &events)?;
                    break;
                }
            }
        }
        Ok(events)
    }
}
