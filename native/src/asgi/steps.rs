//! AppSteps: the app's coroutine, awaited by the request's task through this object, which sees
//! each step of the task end. A response head held for its first body message
//! (refork.asgi.response) goes to the connection's flush after the loop iteration only when a
//! step ends with it still held; a response whose start and body come in one step (the common
//! case) so schedules no callback. refork.asgi.cycle.HttpCycle.run awaits it.

use pyo3::exceptions::PyStopIteration;
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::PyTraverseError;

/// AppSteps(coro, cycle): `await AppSteps(app(scope, receive, send), cycle)` is `await
/// app(...)`; cycle.stepping is True while a step runs, and cycle.step_held() is called when a
/// step ends (the coroutine yields to the loop) while cycle.response holds a head.
#[pyclass(module = "refork._native")]
pub(crate) struct AppSteps {
    coro: Option<Py<PyAny>>,
    cycle: Option<Py<PyAny>>,
}

impl AppSteps {
    fn stepping(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        match &self.cycle {
            Some(cycle) => cycle.bind(py).setattr(intern!(py, "stepping"), on),
            None => Ok(()),
        }
    }

    /// What a step gave: a value yielded to the task (after the held-head check), the coroutine's
    /// end (StopIteration, bare for the usual None), or its exception.
    fn after(&self, py: Python<'_>, step: Result<Py<PyAny>, Option<Py<PyAny>>>) -> PyResult<Py<PyAny>> {
        match step {
            Ok(yielded) => {
                if let Some(cycle) = &self.cycle {
                    let cycle = cycle.bind(py);
                    let response = cycle.getattr(intern!(py, "response"))?;
                    if !response.getattr(intern!(py, "held_head"))?.is_none() {
                        cycle.call_method0(intern!(py, "step_held"))?;
                    }
                }
                Ok(yielded)
            }
            Err(Some(result)) if !result.is_none(py) => Err(PyStopIteration::new_err((result,))),
            Err(_) => {
                // SAFETY: sets the interpreter's error indicator, taken back at once by fetch().
                unsafe { ffi::PyErr_SetNone(ffi::PyExc_StopIteration) };
                Err(PyErr::fetch(py))
            }
        }
    }

    fn send_value(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let Some(coro) = &self.coro else {
            return Err(PyStopIteration::new_err(()));
        };
        self.stepping(py, true)?;
        let mut out: *mut ffi::PyObject = std::ptr::null_mut();
        // SAFETY: both pointers are live references held for the call; `out` is written by it.
        let status = unsafe { ffi::PyIter_Send(coro.as_ptr(), value.as_ptr(), &mut out) };
        let step = match status {
            // SAFETY: PyIter_Send gave a new reference in `out` for these two.
            ffi::PySendResult::PYGEN_NEXT => Ok(unsafe { Bound::from_owned_ptr(py, out) }.unbind()),
            ffi::PySendResult::PYGEN_RETURN => Err(Ok(unsafe { Bound::from_owned_ptr(py, out) }.unbind())),
            _ => Err(Err(PyErr::fetch(py))),
        };
        self.stepping(py, false)?;
        match step {
            Ok(yielded) => self.after(py, Ok(yielded)),
            Err(Ok(result)) => self.after(py, Err(Some(result))),
            Err(Err(err)) => Err(err),
        }
    }
}

#[pymethods]
impl AppSteps {
    #[new]
    fn new(coro: Py<PyAny>, cycle: Py<PyAny>) -> Self {
        AppSteps { coro: Some(coro), cycle: Some(cycle) }
    }

    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The app's coroutine, as a coroutine's `cr_await` names what it awaits: the chain of awaits
    /// of a hung request (refork.process.stacks) goes on through it to the app's frames.
    #[getter]
    fn cr_await(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.coro.as_ref().map(|coro| coro.clone_ref(py))
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.send_value(py, &py.None().into_bound(py))
    }

    fn send(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.send_value(py, value)
    }

    /// The task's throw (a cancellation): into the app's coroutine, with the arguments given.
    #[pyo3(signature = (*args))]
    fn throw(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<Py<PyAny>> {
        let Some(coro) = &self.coro else {
            return Err(PyErr::from_value(args.get_item(0)?));
        };
        self.stepping(py, true)?;
        let step = coro.bind(py).call_method1(intern!(py, "throw"), args);
        self.stepping(py, false)?;
        self.after(py, Ok(step?.unbind()))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(coro) = &self.coro {
            coro.bind(py).call_method0(intern!(py, "close"))?;
        }
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.coro)?;
        visit.call(&self.cycle)?;
        Ok(())
    }

    fn __clear__(&mut self) {
        self.coro = None;
        self.cycle = None;
    }
}
