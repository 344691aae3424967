//! `Parser`, the Python loop's drop-in for refork.http.parser.RequestParser: the common shape
//! read by `fast_head`, anything else handed from its first byte to the Python parser; and the
//! Python face of a head (its method as an interned str, its refork.http.events.Request).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple, PyType};

use super::head::{fast_head, Head, HeadLimits};
use super::request::{request_class, KeepAlive};
use crate::host::callable;

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

/// What every Parser makes its events with, built once (refork.serving.parsers): keyword-only,
/// so no two of them can be swapped.
#[pyclass(module = "refork._native", frozen)]
pub struct ParserRefs {
    /// python_parser(limits) -> the refork.http.parser.RequestParser of a message the fast path
    /// does not take
    python_parser: Py<PyAny>,
    request: Py<PyAny>,
    body: Py<PyAny>,
    end_of_message: Py<PyAny>,
    parse_error: Py<PyAny>,
}

#[pymethods]
impl ParserRefs {
    #[new]
    #[pyo3(signature = (*, python_parser, request, body, end_of_message, parse_error))]
    fn new(
        python_parser: &Bound<'_, PyAny>,
        request: &Bound<'_, PyType>,
        body: &Bound<'_, PyType>,
        end_of_message: Py<PyAny>,
        parse_error: &Bound<'_, PyType>,
    ) -> PyResult<Self> {
        Ok(ParserRefs {
            python_parser: callable(python_parser)?,
            request: request_class(request)?,
            body: body.clone().into_any().unbind(),
            end_of_message,
            parse_error: parse_error.clone().into_any().unbind(),
        })
    }
}

/// A refork.http.parser.RequestParser, its methods bound once when it is made.
struct PythonParser {
    parser: Py<PyAny>,
    bound: ParserMethods,
}

#[derive(FromPyObject)]
struct ParserMethods {
    #[pyo3(from_py_with = callable)]
    feed: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    release: Py<PyAny>,
}

/// A RequestParser's state, read after each of its feeds (it changes only then).
#[derive(FromPyObject, Default)]
struct PythonParserState {
    in_message: bool,
    buffered: usize,
    head_held: usize,
    upgraded: Option<Py<PyBytes>>,
}

/// The refork.http.events.ParseError raised: the requests it completed before the bad bytes.
#[derive(FromPyObject)]
struct ParseErrorEvents<'py> {
    events: Bound<'py, PyList>,
}

#[pyclass(module = "refork._native")]
pub struct Parser {
    head_limits: HeadLimits,
    body_left: u64,
    keep_alive: bool,
    closed: bool,
    /// The Python RequestParser of a message the fast path does not take (None: fast path).
    slow: Option<PythonParser>,
    /// its state after its last feed (the default on the fast path)
    state: PythonParserState,
    limits: Py<PyAny>,
    refs: Py<ParserRefs>,
}

/// The refork.http.events.Request of a fast head (`cls` is that class, its fields given in order:
/// checked once by request.rs's request_class).
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
        request_object(py, self.refs.get().request.bind(py), head)
    }

    /// Feed the Python parser; its state is read after each feed.
    fn python_feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let slow = self.slow.as_ref().expect("a Python parser");
        let got = slow.bound.feed.bind(py).call1((PyBytes::new(py, data),));
        // (after an error too: the loop answers it, then asks)
        self.state = slow.parser.bind(py).extract()?;
        got
    }

    /// Hand `data` (from a message boundary) to a Python parser; its events join `events`.
    fn feed_slow(&mut self, py: Python<'_>, data: &[u8], events: &Bound<'_, PyList>) -> PyResult<()> {
        if self.slow.is_none() {
            let refs = self.refs.get();
            let parser = refs.python_parser.bind(py).call1((self.limits.bind(py),))?;
            self.slow = Some(PythonParser { bound: parser.extract()?, parser: parser.unbind() });
        }
        let got = match self.python_feed(py, data) {
            Ok(got) => got,
            Err(err) => {
                // the requests completed before the bad bytes are answered first: ours, then its own
                if err.is_instance(py, self.refs.get().parse_error.bind(py)) && events.len() > 0 {
                    let before: ParseErrorEvents = err.value(py).extract()?;
                    for (i, e) in events.iter().enumerate() {
                        before.events.insert(i, e)?;
                    }
                }
                return Err(err);
            }
        };
        let mut keeps = true;
        let request_cls = self.refs.get().request.bind(py);
        for e in got.try_iter()? {
            let e = e?;
            if e.is_instance(request_cls)? {
                keeps &= e.extract::<KeepAlive>()?.keep_alive;
            }
            events.append(e)?;
        }
        if !keeps {
            self.closed = true; // it ignores what follows a closing request: keep it to say so
        } else if !self.state.in_message {
            if self.state.upgraded.is_none() {
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
    /// Parser(limits, refs): `limits` is a refork.http.head.Limits, `refs` what it makes its
    /// events with.
    #[new]
    fn new(py: Python<'_>, limits: Py<PyAny>, refs: Py<ParserRefs>) -> PyResult<Self> {
        Ok(Parser {
            head_limits: HeadLimits::from_py(limits.bind(py))?,
            body_left: 0,
            keep_alive: true,
            closed: false,
            slow: None,
            state: PythonParserState::default(),
            limits,
            refs,
        })
    }

    /// The connection is gone: let go of what the Python parser of a message holds
    /// (refork.http.parser.RequestParser.release); feed() returns nothing from now on.
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(p) = self.slow.take() {
            p.bound.release.bind(py).call0()?;
        }
        self.state = PythonParserState::default();
        self.closed = true;
        self.body_left = 0;
        Ok(())
    }

    /// True from the first byte of a request until its EndOfMessage.
    #[getter]
    fn in_message(&self) -> bool {
        self.body_left > 0 || self.state.in_message
    }

    /// What the Python parser of a message in progress holds of it (refork.http.parser's
    /// `buffered`); the fast path holds nothing between reads.
    #[getter]
    fn buffered(&self) -> usize {
        self.state.buffered
    }

    /// Bytes of the head in progress (refork.http.parser's `head_held`).
    #[getter]
    fn head_held(&self) -> usize {
        self.state.head_held
    }

    /// After a WebSocket handshake (a Python parser made with `hand_off_websocket`): the bytes
    /// that followed its head (refork.http.parser's `upgraded`); None before.
    #[getter]
    fn upgraded(&self, py: Python<'_>) -> Option<Py<PyBytes>> {
        self.state.upgraded.as_ref().map(|b| b.clone_ref(py))
    }

    /// Parse more bytes; return the events they complete, in order (ParseError as the Python parser).
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let events = PyList::empty(py);
        if self.slow.is_some() {
            if self.closed {
                return Ok(self.python_feed(py, data)?.cast_into()?);
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
                events.append(self.refs.get().body.bind(py).call1((PyBytes::new(py, &data[at..at + take]),))?)?;
                at += take;
                self.body_left -= take as u64;
                if self.body_left == 0 {
                    events.append(self.refs.get().end_of_message.bind(py))?;
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
                            events.append(self.refs.get().end_of_message.bind(py))?;
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
