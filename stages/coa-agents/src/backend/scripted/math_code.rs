//! The math and code experts: write a program, run it, read what it printed, and answer.

use anyhow::{bail, Result};
use coa_schemas::rows::Task;
use coa_tasks::MathSolution;

use super::mind::{intent, last_observation, Intent};
use super::rng::{Rng, Streams};
use super::{CodeSol, Noise};
use crate::action::{Action, Step};

/// The value a program printed: the last non-empty stdout line of a successful run.
pub(super) fn printed_value(observation: &str) -> Option<String> {
    if !observation.starts_with("[EXECUTED]") {
        return None;
    }
    let start = observation.find("[STDOUT:BEGIN]\n")? + "[STDOUT:BEGIN]\n".len();
    let end = observation[start..].find("\n[STDOUT:END]").map_or(observation.len(), |e| start + e);
    observation[start..end].lines().rev().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

#[derive(Debug, Clone, PartialEq)]
enum CodePhase {
    Start,
    Planned,
    /// Next: the sub-task round (code: edge inputs).
    SubNext,
    /// Ran the sub-task round: setting up the quantities (math) or edge inputs (code).
    SubRan,
    /// Ran the buggy (`buggy`) or the reference program.
    Ran { buggy: bool },
    /// Reflected; `accept` = the next action is the answer.
    Reflected { accept: Option<String> },
    Answered { answer: String },
}

/// Share of math runs that first set up (and print) the statement's quantities, and of code runs
/// that try the function on edge inputs after the example: the code pattern's sub-task rounds.
const SUBTASK_ROUND: f64 = 0.35;

/// The leading `name = <number expression>` lines of a program (after its imports), as a
/// program that prints each quantity; `None` when there are none.
pub(super) fn setup_program(code: &str) -> Option<String> {
    let mut lines = Vec::new();
    let mut names = Vec::new();
    for line in code.lines().skip_while(|l| l.starts_with("import ") || l.starts_with("from ")) {
        let Some((lhs, rhs)) = line.split_once(" = ") else { break };
        let is_name = lhs.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && lhs.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let is_number = !rhs.trim().is_empty() && rhs.chars().all(|c| c.is_ascii_digit() || " .+-*/()".contains(c));
        if !is_name || !is_number {
            break;
        }
        lines.push(line.to_string());
        names.push(lhs.to_string());
    }
    if names.is_empty() {
        return None;
    }
    let prints: Vec<String> = names.iter().map(|n| format!("print('{n} =', {n})")).collect();
    Some(format!("# the quantities given in the statement\n{}\n{}", lines.join("\n"), prints.join("\n")))
}

pub(super) struct MathExpert {
    sol: MathSolution,
    buggy_first: bool,
    give_up: bool,
    setup: Option<String>,
    runs: usize,
    rng: Rng,
    phase: CodePhase,
}

impl MathExpert {
    pub(super) fn new(sol: MathSolution, noise: &Noise, s: &Streams<'_>) -> MathExpert {
        let give_up = s.rng("give_up").chance(noise.give_up);
        let buggy_first = s.rng("buggy_code").chance(noise.buggy_code);
        let setup = setup_program(&sol.code).filter(|_| s.rng("style").chance(SUBTASK_ROUND));
        MathExpert { sol, buggy_first, give_up, setup, runs: 0, rng: s.rng("phrasing"), phase: CodePhase::Start }
    }

    pub(super) fn decide(&mut self, steps: &[Step]) -> Result<Intent> {
        let phase = self.phase.clone();
        Ok(match phase {
            CodePhase::Start => {
                self.phase = CodePhase::Planned;
                let think = self.rng.pick(&[
                    "The numbers need exact computation, so I will let a program do the arithmetic.",
                    "This word problem is easiest to solve by computing it in Python.",
                ]);
                let plan = if self.setup.is_some() {
                    "1. Write down the quantities given in the statement as Python variables and check them.\n\
2. Compute the quantity asked for from them, in a short program.\n3. Check the printed value against the statement (rounding, units).\n\
4. Report the value as \\boxed{}."
                } else {
                    "1. Translate the word problem into a short Python program that computes the quantity asked for.\n\
2. Run it and check the printed value against the statement (rounding, units).\n3. Report the value as \\boxed{}."
                };
                intent(Action::Plan, think.to_string(), plan.to_string(), "the task starts with a plan")
            }
            CodePhase::Planned if self.setup.is_some() => {
                let code = self.setup.take().expect("checked");
                self.phase = CodePhase::SubRan;
                intent(Action::Code, "First the quantities of the statement, printed so I can check them.".to_string(), code, "set up the quantities")
            }
            CodePhase::SubNext => bail!("math runs have no edge-input round"),
            CodePhase::SubRan => {
                let obs = last_observation(steps);
                let shown: Vec<&str> = obs.lines().filter(|l| l.contains(" = ")).collect();
                let (grades, text) = if obs.starts_with("[EXECUTED]") {
                    ("information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good", format!("The quantities match the statement: {}. Next, the computation.", shown.join(", ")))
                } else {
                    ("information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair", "Setting up the quantities failed; I will write the whole computation in one program.".to_string())
                };
                self.phase = CodePhase::Reflected { accept: None };
                intent(Action::Reflection, "Do the printed quantities match the statement?".to_string(), format!("{grades}\n{text}"), "check the set-up")
            }
            CodePhase::Planned | CodePhase::Reflected { accept: None } => {
                let buggy = self.runs == 0 && (self.buggy_first || self.give_up);
                self.runs += 1;
                let (think, code) = if self.runs == 1 {
                    ("I will compute the quantity step by step in Python and print it.".to_string(), if buggy { &self.sol.buggy_code } else { &self.sol.code })
                } else {
                    ("Rewrite the computation so that it follows the statement exactly.".to_string(), &self.sol.code)
                };
                let code = code.clone();
                self.phase = CodePhase::Ran { buggy };
                intent(Action::Code, think, code, "compute it")
            }
            CodePhase::Ran { buggy } => {
                let obs = last_observation(steps);
                let value = printed_value(obs);
                let (grades, text, accept) = match &value {
                    None if self.runs < 3 => (
                        "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The program failed before printing a result; it has to be fixed.".to_string(),
                        None,
                    ),
                    None => (
                        "information_conflict: Fair\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The program keeps failing; there is no value to report.".to_string(),
                        Some(String::new()),
                    ),
                    Some(v) if buggy && !self.give_up => (
                        "information_conflict: Fair\ntool_effectiveness: Good\ntrajectory_monitoring: Fair",
                        format!("The program printed {v}, but re-deriving the computation from the statement shows it does not apply the problem's conditions exactly (a simplified formula or an off-by-one). It must be fixed."),
                        None,
                    ),
                    Some(v) => (
                        "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good",
                        format!("The program follows the statement and printed {v}, in the form the question asks for."),
                        Some(v.clone()),
                    ),
                };
                let think = match &value {
                    Some(v) => format!("The program printed {v}. Does it answer the question as stated?"),
                    None => "The run failed.".to_string(),
                };
                self.phase = CodePhase::Reflected { accept: accept.clone() };
                intent(Action::Reflection, think, format!("{grades}\n{text}"), "judge the program's result")
            }
            CodePhase::Reflected { accept: Some(value) } | CodePhase::Answered { answer: value } => {
                self.phase = CodePhase::Answered { answer: value.clone() };
                let think = format!("The computed value is {value}.");
                intent(Action::Answer, think, format!("\\boxed{{{value}}}"), "the result checks out: answer")
            }
        })
    }
}

/// The example of a code question: (`call`, `expected`) from `Example: \`f(x)\` returns \`y\``
/// (synthetic suite) or the first doctest `>>> f(x)` followed by its result line (HumanEval).
pub(super) fn code_example(question: &str) -> Option<(String, String)> {
    if let Some(i) = question.find("Example: `") {
        let rest = &question[i + "Example: `".len()..];
        let (call, rest) = rest.split_once("` returns `")?;
        let expected = rest.split('`').next()?;
        return Some((call.to_string(), expected.to_string()));
    }
    let mut lines = question.lines();
    while let Some(line) = lines.next() {
        if let Some(call) = line.trim().strip_prefix(">>> ") {
            let expected = lines.next()?.trim();
            if expected.is_empty() || expected.starts_with(">>>") {
                return None;
            }
            return Some((call.trim().to_string(), expected.to_string()));
        }
    }
    None
}

/// Splits on commas outside brackets and quotes (`None` when the text has escapes).
fn split_top(s: &str) -> Option<Vec<&str>> {
    if s.contains('\\') {
        return None;
    }
    let (mut parts, mut depth, mut quote, mut start) = (Vec::new(), 0i32, None, 0);
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '\'' | '"' => quote = Some(c),
                '[' | '(' | '{' => depth += 1,
                ']' | ')' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            },
        }
    }
    parts.push(&s[start..]);
    Some(parts)
}

/// Edge inputs for a one-argument example call `f(arg)`: an empty and a one-element list, an
/// empty and a one-character string, or 1 and the example's number plus one.
pub(super) fn edge_inputs(call: &str) -> Option<(String, Vec<String>)> {
    let open = call.find('(')?;
    let name = &call[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let arg = call[open + 1..].strip_suffix(')')?.trim();
    if split_top(arg)?.len() != 1 {
        return None;
    }
    let edges = match arg.chars().next()? {
        '[' => {
            let inner = arg.strip_prefix('[')?.strip_suffix(']')?;
            let first = split_top(inner)?[0].trim().to_string();
            if first.is_empty() {
                return None;
            }
            vec!["[]".to_string(), format!("[{first}]")]
        }
        q @ ('\'' | '"') => {
            let c = arg[1..].chars().next().filter(|c| c.is_ascii_alphanumeric())?;
            vec![format!("{q}{q}"), format!("{q}{c}{q}")]
        }
        '0'..='9' => vec!["1".to_string(), (arg.parse::<i64>().ok()? + 1).to_string()],
        _ => return None,
    };
    Some((name.to_string(), edges))
}

pub(super) struct CodeExpert {
    program: String,
    buggy: Option<String>,
    example: Option<(String, String)>,
    /// The edge-input round still to do: (function name, argument literals).
    edge: Option<(String, Vec<String>)>,
    signature: String,
    buggy_first: bool,
    give_up: bool,
    runs: usize,
    rng: Rng,
    phase: CodePhase,
    last_program: String,
}

impl CodeExpert {
    pub(super) fn new(task: &Task, sol: CodeSol, noise: &Noise, s: &Streams<'_>) -> CodeExpert {
        let give_up = sol.buggy_code.is_some() && s.rng("give_up").chance(noise.give_up);
        let buggy_first = sol.buggy_code.is_some() && s.rng("buggy_code").chance(noise.buggy_code);
        let entry = task.entry_point.clone().unwrap_or_else(|| "the function".to_string());
        let signature = task.question.split('`').nth(1).filter(|s| s.contains('(')).map(str::to_string).unwrap_or(entry);
        CodeExpert {
            program: sol.code.trim_end().to_string(),
            buggy: sol.buggy_code.map(|b| b.trim_end().to_string()),
            example: code_example(&task.question),
            edge: code_example(&task.question).and_then(|(call, _)| edge_inputs(&call)).filter(|_| s.rng("style").chance(SUBTASK_ROUND)),
            signature,
            buggy_first,
            give_up,
            runs: 0,
            rng: s.rng("phrasing"),
            phase: CodePhase::Start,
            last_program: String::new(),
        }
    }

    /// The program plus a check on the statement's example.
    fn with_example(&self, program: &str) -> String {
        match &self.example {
            Some((call, expected)) => format!(
                "{program}\n\n\n# check the example from the statement\n_result = {call}\nprint('example result:', repr(_result))\n\
try:\n    _expected = eval({})\nexcept Exception:\n    print('example passed: unknown')\nelse:\n    print('example passed:', _result == _expected)\n",
                serde_json::to_string(expected).unwrap_or_else(|_| "''".to_string())
            ),
            None => format!("{program}\n\nprint('defined without errors')\n"),
        }
    }

    pub(super) fn decide(&mut self, steps: &[Step]) -> Result<Intent> {
        let phase = self.phase.clone();
        Ok(match phase {
            CodePhase::Start => {
                self.phase = CodePhase::Planned;
                let think = format!("I need to write `{}` and make sure it behaves as described.", self.signature);
                let plan = format!(
                    "1. Implement `{}` following the description.\n2. Run it on the example from the statement and check the result.\n3. Fix any mismatch, then submit the function.",
                    self.signature
                );
                intent(Action::Plan, think, plan, "the task starts with a plan")
            }
            CodePhase::Planned | CodePhase::Reflected { accept: None } => {
                let use_buggy = self.runs == 0 && (self.buggy_first || self.give_up);
                let program = match (&self.buggy, use_buggy) {
                    (Some(b), true) => b.clone(),
                    _ => self.program.clone(),
                };
                self.runs += 1;
                let think = if self.runs == 1 {
                    self.rng.pick(&["I will implement the function and test it on the example.", "A direct implementation, checked against the example from the statement."]).to_string()
                } else {
                    "Fix the implementation so that it follows the description exactly, and test again.".to_string()
                };
                self.last_program = program.clone();
                self.phase = CodePhase::Ran { buggy: use_buggy };
                intent(Action::Code, think, self.with_example(&program), "implement and test it")
            }
            CodePhase::Ran { buggy: _ } => {
                let obs = last_observation(steps);
                let ran = obs.starts_with("[EXECUTED]");
                let passed = ran && !obs.contains("example passed: False");
                if passed && self.runs == 1 && self.edge.is_some() {
                    let body = "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good\n\
The function runs and reproduces the example from the statement. Before submitting, try it on edge inputs.";
                    self.phase = CodePhase::SubNext;
                    return Ok(intent(Action::Reflection, "The run finished; compare it with the example.".to_string(), body.to_string(), "judge the test run"));
                }
                let (grades, text, accept) = if passed {
                    (
                        "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good",
                        if self.example.is_some() { "The function runs and reproduces the example from the statement." } else { "The function is defined and runs without errors." }.to_string(),
                        true,
                    )
                } else if self.give_up || self.runs >= 2 {
                    (
                        "information_conflict: Fair\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The example still does not come out right, but I will submit this version.".to_string(),
                        true,
                    )
                } else if ran {
                    (
                        "information_conflict: Fair\ntool_effectiveness: Good\ntrajectory_monitoring: Fair",
                        "The function returns the wrong result on the example: the implementation does not follow the description (an edge case or an off-by-one). It must be fixed.".to_string(),
                        false,
                    )
                } else {
                    (
                        "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The program failed with an error; the implementation must be fixed.".to_string(),
                        false,
                    )
                };
                let think = if passed { "The run finished; compare it with the example.".to_string() } else { "The run does not match the example.".to_string() };
                self.phase = CodePhase::Reflected { accept: accept.then(|| self.last_program.clone()) };
                intent(Action::Reflection, think, format!("{grades}\n{text}"), "judge the test run")
            }
            CodePhase::SubNext => {
                let (name, args) = self.edge.take().expect("an edge round is planned");
                let code = format!(
                    "{}\n\n\n# edge inputs\nfor _arg in [{}]:\n    try:\n        print('{name}(' + repr(_arg) + ') ->', repr({name}(_arg)))\n    \
except Exception as _e:\n        print('{name}(' + repr(_arg) + ') raised', type(_e).__name__ + ':', _e)\n",
                    self.last_program,
                    args.join(", ")
                );
                self.phase = CodePhase::SubRan;
                intent(Action::Code, "Edge inputs: what does the function do with the smallest inputs?".to_string(), code, "try edge inputs")
            }
            CodePhase::SubRan => {
                let obs = last_observation(steps);
                let results: Vec<&str> = obs.lines().filter(|l| l.contains(") -> ") || l.contains(") raised ")).collect();
                let raised = results.iter().any(|l| l.contains(") raised "));
                let (grades, text) = if !obs.starts_with("[EXECUTED]") {
                    ("information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair", "The edge-input run did not finish; the example passes, so I submit the function.".to_string())
                } else if raised {
                    (
                        "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Good",
                        format!("On edge inputs: {}. The statement does not define the input that raises, so the behaviour is acceptable.", results.join("; ")),
                    )
                } else {
                    ("information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good", format!("On edge inputs: {}. These agree with the description.", results.join("; ")))
                };
                self.phase = CodePhase::Reflected { accept: Some(self.last_program.clone()) };
                intent(Action::Reflection, "Check the edge results against the description.".to_string(), format!("{grades}\n{text}"), "judge the edge run")
            }
            CodePhase::Reflected { accept: Some(program) } | CodePhase::Answered { answer: program } => {
                self.phase = CodePhase::Answered { answer: program.clone() };
                let think = "Submit the function.".to_string();
                intent(Action::Answer, think, format!("```python\n{program}\n```"), "the function is done: answer")
            }
        })
    }
}
