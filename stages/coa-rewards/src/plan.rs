//! Assert-style test code turned into (call, expected) pairs, so that the verdict is decided here,
//! outside the candidate's process ([`crate::code`]).
//!
//! `plan.py` (run by a trusted `python3` outside every sandbox; it parses and reads literals,
//! executing nothing) recognises `assert candidate(ARGS) == V` and its kin (its header lists
//! them). A test of which every statement is one of those becomes [`Plan::Calls`]: the driver
//! calls the program's function with ARGS in the sandbox and the plain value it returns is
//! compared with V here ([`Check::holds`]), with Python's semantics. Anything else (loops, random
//! inputs, helpers of the task's prompt) is [`Plan::Checker`]: the test code runs whole in a
//! second sandboxed process that calls the program through the driver. Plans are cached per test
//! text (a task's G samples are planned once).

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Context, Result};
use coa_tools::{find_python, PyValue, PLAIN_PY};
use coa_schemas::text::shorten;
use serde_json::Value as Json;

const PLANNER: &str = include_str!("plan.py");

/// How a test is graded.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Call by call, each result checked here.
    Calls(Vec<PlannedCall>),
    /// The whole test code in a checker process; `remote` are the names it takes from the
    /// program, `why` says which statement could not be planned.
    Checker { remote: Vec<String>, why: String },
}

/// One call of the program's and what its result must satisfy.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCall {
    /// The driver's request line (function and arguments only: no expected value).
    pub request: String,
    /// `f(args)`, for failure messages.
    pub shown: String,
    pub checks: Vec<Check>,
}

/// What a call's result must satisfy, as the assertion it came from says.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// `== V`
    Eq(PyValue),
    /// `is None` / `is True` / `is False`
    Is(PyValue),
    /// `assert r` (true) or `assert not r` (false)
    Truthy(bool),
    /// `abs(r - V) < tol` (strict) or `<= tol`
    Near { value: PyValue, tol: PyValue, strict: bool },
    /// `math.isclose(r, V, rel_tol=rel, abs_tol=abs)`
    IsClose { value: PyValue, rel: PyValue, abs: PyValue },
}

impl Check {
    /// Whether `got` passes, as the Python assertion would decide (a number expected where
    /// `got` is none fails, as Python's TypeError would).
    pub fn holds(&self, got: &PyValue) -> bool {
        match self {
            Check::Eq(v) => got.py_eq(v),
            Check::Is(v) => got == v,
            Check::Truthy(want) => got.truthy() == *want,
            Check::Near { value, tol, strict } => match (got.as_f64(), value.as_f64(), tol.as_f64()) {
                (Some(g), Some(v), Some(t)) if *strict => (g - v).abs() < t,
                (Some(g), Some(v), Some(t)) => (g - v).abs() <= t,
                _ => false,
            },
            Check::IsClose { value, rel, abs } => match (got.as_f64(), value.as_f64(), rel.as_f64(), abs.as_f64()) {
                (Some(a), Some(b), Some(rel), Some(abs)) => {
                    a == b || (a.is_finite() && b.is_finite() && (a - b).abs() <= (rel * a.abs().max(b.abs())).max(abs))
                }
                _ => false,
            },
        }
    }

    /// The assertion, for failure messages.
    pub fn describe(&self) -> String {
        match self {
            Check::Eq(v) => format!("== {}", v.repr(200)),
            Check::Is(v) => format!("is {}", v.repr(10)),
            Check::Truthy(true) => "is true".into(),
            Check::Truthy(false) => "is false".into(),
            Check::Near { value, tol, strict } => format!("within {} {} of {}", if *strict { "<" } else { "<=" }, tol.repr(40), value.repr(200)),
            Check::IsClose { value, rel, abs } => format!("isclose to {} (rel_tol {}, abs_tol {})", value.repr(200), rel.repr(40), abs.repr(40)),
        }
    }
}

/// The plan of `test_code` (cached per text).
pub fn plan(test_code: &str) -> Result<Arc<Plan>> {
    if let Some(p) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(test_code) {
        return Ok(p.clone());
    }
    plan_all(&[test_code])?;
    cache().lock().unwrap_or_else(|e| e.into_inner()).get(test_code).cloned().ok_or_else(|| anyhow!("internal: a plan went missing"))
}

/// Plans every test text not planned yet with one planner process (a python3 start costs more
/// than grading a run), so that [`plan`] finds them cached: what a stage calls before grading a
/// table.
pub fn plan_all(test_codes: &[&str]) -> Result<()> {
    let todo: Vec<&str> = {
        let cached = cache().lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = std::collections::HashSet::new();
        test_codes.iter().copied().filter(|t| !cached.contains_key(*t) && seen.insert(*t)).collect()
    };
    if todo.is_empty() {
        return Ok(());
    }
    let plans = run_planner(&todo)?;
    let mut cached = cache().lock().unwrap_or_else(|e| e.into_inner());
    for (code, planned) in todo.into_iter().zip(plans) {
        cached.insert(code.to_string(), Arc::new(planned));
    }
    Ok(())
}

fn cache() -> &'static Mutex<HashMap<String, Arc<Plan>>> {
    static PLANS: OnceLock<Mutex<HashMap<String, Arc<Plan>>>> = OnceLock::new();
    PLANS.get_or_init(Default::default)
}

fn run_planner(test_codes: &[&str]) -> Result<Vec<Plan>> {
    let python = find_python()?;
    // -I -S: no environment, no user or site packages: only the standard library's ast and json.
    let mut child = Command::new(&python)
        .args(["-I", "-S", "-c", &format!("{PLAIN_PY}\n{PLANNER}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the test planner ({})", python.display()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = serde_json::to_vec(test_codes).context("passing the test planner its tests")?;
    // Fed from a thread: tests bigger than the pipe would otherwise wait on the planner's output.
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().context("running the test planner")?;
    let _ = feeder.join();
    if !out.status.success() {
        bail!("the test planner failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let json: Json = serde_json::from_slice(&out.stdout).context("reading the test planner's plans")?;
    let plans = json.as_array().filter(|p| p.len() == test_codes.len()).ok_or_else(|| anyhow!("the test planner did not answer one plan per test"))?;
    plans.iter().map(|p| parse_plan(p).with_context(|| format!("the test planner's plan {}", shorten(&p.to_string(), 200)))).collect()
}

fn parse_plan(json: &Json) -> Result<Plan> {
    if let Some(remote) = json.get("remote") {
        let remote = serde_json::from_value(remote.clone()).context("`remote` must list names")?;
        let why = json.get("why").and_then(Json::as_str).unwrap_or_default().to_string();
        return Ok(Plan::Checker { remote, why });
    }
    let calls = json.get("calls").and_then(Json::as_array).ok_or_else(|| anyhow!("no `calls` and no `remote`"))?;
    calls.iter().map(parse_call).collect::<Result<_>>().map(Plan::Calls)
}

fn parse_call(call: &Json) -> Result<PlannedCall> {
    let field = |k: &str| call.get(k).ok_or_else(|| anyhow!("a call without `{k}`"));
    let text = |k: &str| field(k)?.as_str().map(str::to_string).ok_or_else(|| anyhow!("`{k}` must be a string"));
    let (request, shown) = (text("req")?, text("shown")?);
    if request.contains('\n') {
        bail!("a request of more than one line");
    }
    let value = |j: &Json| PyValue::from_json(j);
    let checks = field("checks")?
        .as_array()
        .ok_or_else(|| anyhow!("`checks` must be a list"))?
        .iter()
        .map(|c| {
            let get = |k: &str| c.get(k).map(value).transpose();
            Ok(if let Some(v) = get("eq")? {
                Check::Eq(v)
            } else if let Some(v) = get("is")? {
                Check::Is(v)
            } else if let Some(b) = c.get("truthy").and_then(Json::as_bool) {
                Check::Truthy(b)
            } else if let (Some(v), Some(tol)) = (get("near")?, get("tol")?) {
                Check::Near { value: v, tol, strict: c.get("strict").and_then(Json::as_bool).unwrap_or(false) }
            } else if let (Some(v), Some(rel), Some(abs)) = (get("isclose")?, get("rel")?, get("abs")?) {
                Check::IsClose { value: v, rel, abs }
            } else {
                bail!("unknown check {c}")
            })
        })
        .collect::<Result<_>>()?;
    Ok(PlannedCall { request, shown, checks })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(test: &str) -> Vec<PlannedCall> {
        match &*plan(test).unwrap() {
            Plan::Calls(c) => c.clone(),
            other => panic!("not planned: {other:?}"),
        }
    }

    fn int(i: i64) -> PyValue {
        PyValue::Int(i.to_string())
    }

    #[test]
    fn assertions_become_calls_and_checks() {
        let test = "METADATA = {'a': 1}\nimport math\n\ndef check(candidate):\n    \"\"\"doc\"\"\"\n    assert candidate([1, 2], k=3) == 6, 'msg'\n    \
                    assert (1, 'x') == candidate([], k=0)\n    assert candidate([5]) is None\n    assert not candidate([0])\n    assert True\n    \
                    assert abs(candidate([1]) - 0.5) < 1e-6\n    assert math.isclose(candidate([2]), 2.0, rel_tol=1e-3)\n\ncheck(total)\n";
        let c = calls(test);
        assert_eq!(c.len(), 6);
        assert_eq!(c[0].request, "(['total'], ([1, 2],), {'k': 3})", "no expected value in a request");
        assert_eq!(c[0].shown, "total([1, 2], k=3)");
        assert_eq!(c[0].checks, vec![Check::Eq(int(6))]);
        assert_eq!(c[1].checks, vec![Check::Eq(PyValue::Tuple(vec![int(1), PyValue::Str("x".into())]))]);
        assert_eq!(c[1].request, "(['total'], ([],), {'k': 0})");
        assert_eq!(c[2].checks, vec![Check::Is(PyValue::None)]);
        assert_eq!(c[3].checks, vec![Check::Truthy(false)]);
        assert!(c[4].checks[0].holds(&PyValue::Float(0.5000001)) && !c[4].checks[0].holds(&PyValue::Float(0.51)));
        assert!(c[5].checks[0].holds(&PyValue::Float(2.001)) && !c[5].checks[0].holds(&PyValue::Str("2".into())));
        assert!(Check::Is(PyValue::Bool(true)).holds(&PyValue::Bool(true)) && !Check::Is(PyValue::Bool(true)).holds(&int(1)), "`is True` is not `== 1`");
        // LiveCodeBench's form.
        let c = calls("\nresult = Solution().f('11111', 1)\nassert result == 15, f\"Expected 15, but got {repr(result)}\"\n");
        assert_eq!(c[0].request, "(['Solution', 'f'], ('11111', 1), {})");
        assert_eq!(c[0].shown, "Solution().f('11111', 1)");
    }

    #[test]
    fn everything_else_goes_to_a_checker() {
        for (test, why) in [
            ("def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n\ncheck(f)\n", "line 2"),
            ("def check(candidate):\n    assert candidate(x) == 1\n\ncheck(f)\n", "not a plain literal"),
            ("def check(candidate):\n    assert candidate(1) == helper(1)\n\ncheck(f)\n", "not a plain literal"),
            ("def check(candidate):\n    assert candidate(1) == 1\n", "never called"),
            ("def check(candidate):\n    assert False\n\ncheck(f)\n", "always fails"),
            ("def check(candidate):\n    r = candidate(1)\n\ncheck(f)\n", "never checked"),
            ("def check(candidate:\n", "do not parse"),
        ] {
            match &*plan(test).unwrap() {
                Plan::Checker { why: w, .. } => assert!(w.contains(why), "{test:?}: {w}"),
                other => panic!("{test:?} planned: {other:?}"),
            }
        }
        let Plan::Checker { remote, .. } = &*plan("import math\ndef check(candidate):\n    for x in range(3):\n        assert poly(candidate(x)) < 1\n\ncheck(find_zero)\n").unwrap() else { panic!() };
        assert_eq!(remote, &["find_zero".to_string(), "poly".to_string()], "the names the tests take from the program");
    }
}
