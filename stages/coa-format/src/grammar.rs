//! The ordering rules of a CoA trajectory as an explicit state machine: the orders AFM's own
//! prompts document for each kind of agent, so that a model trained here can be evaluated with
//! AFM's prompts and the other way round.
//!
//! The state is the last action tag (every tag but `<think>`; the start is `None`) plus whether a
//! `<think>` is pending. The transition tables ([`WEB_TRANSITIONS`], [`QA_TRANSITIONS`],
//! [`CODE_TRANSITIONS`]) list, per state, the actions that may come next; [`think_rule`] says,
//! per flavor, whether an action needs a `<think>` right before it (never an `<observation>`:
//! the environment answers the tool call directly; two `<think>` in a row are an error):
//!
//! - **Web** (AFM's web agent; our `multihop` suite and other web suites): a `<think>` precedes
//!   every plan, tool call, reflection, suggested_answer and double_check (required), and may
//!   precede `<answer>`. start → plan; plan → search, crawl or suggested_answer; a tool call →
//!   observation; observation → plan, search, crawl, reflection or suggested_answer; reflection →
//!   plan, search, crawl or suggested_answer; suggested_answer → double_check; double_check →
//!   plan, search, crawl or answer.
//! - **Qa** (the `qa` suite: AFM's multi-hop QA agent and its web agent): the web order, and also
//!   AFM's MHQA order `think, plan, (think, wiki_search, observation, [think, reflection])*,
//!   think, answer`: `<answer>` may also follow a plan, an observation or a reflection, and a
//!   reflection need not grade (when it does, a Poor grade still means re-plan).
//! - **Code** (AFM's code agent; `math` and `code`): `plan, (think, code, observation,
//!   reflection)*, think, answer`: the plan comes first, with no `<think>` before it; the
//!   reflection follows the observation directly; a `<think>` precedes every `<code>` and the
//!   `<answer>` (required). start → plan; plan → code or answer; code → observation;
//!   observation → reflection; reflection → code or answer.
//! - `<answer>` ends the trajectory; a trajectory must end with it.
//!
//! [`validate`] also checks the contents that steer the order: every double_check has a
//! `score: N` (1-4) and is followed by `<answer>` exactly when N ≥ 3; in the web flavor every
//! reflection grades its three criteria, and any Poor grade must be followed by a `<plan>`.

use std::fmt;

use coa_schemas::suite::Suite;

use crate::grade::{parse_double_check, parse_reflection, GradeError};
use crate::parse::{parse, ParseError};
use crate::tag::{list_tags, Tag};

/// Which transition table applies (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// AFM's web agent: plan, search/crawl, reflect, suggest, double-check, answer.
    Web,
    /// AFM's multi-hop QA agent as well as its web agent: the web order, or plan, search,
    /// reflect and answer without a suggested answer.
    Qa,
    /// AFM's code agent: plan, then rounds of think + code + observation + reflection, then
    /// think + answer.
    Code,
}

impl Flavor {
    pub const ALL: [Flavor; 3] = [Flavor::Web, Flavor::Qa, Flavor::Code];

    /// `math` and `code` follow the code agent's order, `qa` either QA order, every other suite
    /// (multihop, other web suites) the web agent's.
    pub fn for_suite(suite: &str) -> Flavor {
        match Suite::parse(suite) {
            Some(Suite::Math | Suite::Code) => Flavor::Code,
            Some(Suite::Qa) => Flavor::Qa,
            Some(Suite::Multihop) | None => Flavor::Web,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::Web => "web",
            Flavor::Qa => "qa",
            Flavor::Code => "code",
        }
    }

    /// This flavor's transition table.
    pub fn transitions(self) -> &'static [(Option<Tag>, &'static [Tag])] {
        match self {
            Flavor::Web => WEB_TRANSITIONS,
            Flavor::Qa => QA_TRANSITIONS,
            Flavor::Code => CODE_TRANSITIONS,
        }
    }

    /// Whether every `<reflection>` must grade the three criteria (the web agent's).
    pub fn grades_reflections(self) -> bool {
        self == Flavor::Web
    }
}

/// Whether an action needs a `<think>` right before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkRule {
    Required,
    Optional,
    Forbidden,
}

/// The think rule of an action tag in a flavor (module docs).
pub const fn think_rule(flavor: Flavor, tag: Tag) -> ThinkRule {
    match (flavor, tag) {
        (_, Tag::Observation | Tag::Think) => ThinkRule::Forbidden,
        (Flavor::Code, Tag::Plan | Tag::Reflection) => ThinkRule::Forbidden,
        (Flavor::Code, _) => ThinkRule::Required,
        (_, Tag::Answer) => ThinkRule::Optional,
        _ => ThinkRule::Required,
    }
}

use Tag::*;

/// Web flavor: after the last action (`None` = start), the actions that may come next.
pub const WEB_TRANSITIONS: &[(Option<Tag>, &[Tag])] = &[
    (None, &[Plan]),
    (
        Some(Plan),
        &[WebSearch, WikiSearch, CrawlPage, SuggestedAnswer],
    ),
    (Some(WebSearch), &[Observation]),
    (Some(WikiSearch), &[Observation]),
    (Some(CrawlPage), &[Observation]),
    (
        Some(Observation),
        &[
            Plan,
            WebSearch,
            WikiSearch,
            CrawlPage,
            Reflection,
            SuggestedAnswer,
        ],
    ),
    (
        Some(Reflection),
        &[Plan, WebSearch, WikiSearch, CrawlPage, SuggestedAnswer],
    ),
    (Some(SuggestedAnswer), &[DoubleCheck]),
    (
        Some(DoubleCheck),
        &[Plan, WebSearch, WikiSearch, CrawlPage, Answer],
    ),
    (Some(Answer), &[]),
];

/// Qa flavor: the web table, plus `<answer>` after a plan, an observation or a reflection.
pub const QA_TRANSITIONS: &[(Option<Tag>, &[Tag])] = &[
    (None, &[Plan]),
    (
        Some(Plan),
        &[WebSearch, WikiSearch, CrawlPage, SuggestedAnswer, Answer],
    ),
    (Some(WebSearch), &[Observation]),
    (Some(WikiSearch), &[Observation]),
    (Some(CrawlPage), &[Observation]),
    (
        Some(Observation),
        &[
            Plan,
            WebSearch,
            WikiSearch,
            CrawlPage,
            Reflection,
            SuggestedAnswer,
            Answer,
        ],
    ),
    (
        Some(Reflection),
        &[Plan, WebSearch, WikiSearch, CrawlPage, SuggestedAnswer, Answer],
    ),
    (Some(SuggestedAnswer), &[DoubleCheck]),
    (
        Some(DoubleCheck),
        &[Plan, WebSearch, WikiSearch, CrawlPage, Answer],
    ),
    (Some(Answer), &[]),
];

/// Code flavor: after the last action (`None` = start), the actions that may come next.
pub const CODE_TRANSITIONS: &[(Option<Tag>, &[Tag])] = &[
    (None, &[Plan]),
    (Some(Plan), &[Code, Answer]),
    (Some(Code), &[Observation]),
    (Some(Observation), &[Reflection]),
    (Some(Reflection), &[Code, Answer]),
    (Some(Answer), &[]),
];

/// The actions allowed after `last` (`None` = start); empty for a state the table has no row for
/// (a tag the flavor never uses: nothing may follow it).
pub fn next_actions(flavor: Flavor, last: Option<Tag>) -> &'static [Tag] {
    flavor
        .transitions()
        .iter()
        .find(|(state, _)| *state == last)
        .map_or(&[], |(_, next)| next)
}

/// What is wrong at one position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViolationKind {
    /// A tag the table does not allow here.
    Unexpected,
    /// An action that needs a `<think>` right before it has none.
    MissingThink,
    /// Anything after `<answer>`.
    AfterAnswer,
    /// The trajectory stops before an `<answer>` (`found` is `None`).
    UnexpectedEnd,
    /// A tool-call step without an observation.
    MissingObservation,
    /// An observation attached to a step that is not a tool call.
    ObservationOnNonTool,
    /// A reflection without readable grades (web flavor).
    BadReflection(GradeError),
    /// A double_check without a readable score.
    BadDoubleCheck(GradeError),
    /// A reflection graded Poor not followed by a plan.
    PoorNotReplanned,
    /// A double_check whose score (≥3 answer, ≤2 re-plan) disagrees with the next action.
    ScoreNotFollowed(u8),
}

/// The first violation of a trajectory: where, what was found, what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Index of the offending step (or segment, for [`validate_tags`] / [`validate_text`]);
    /// the number of steps when the trajectory ends too early.
    pub index: usize,
    /// The offending tag; `None` at the end of the trajectory.
    pub found: Option<Tag>,
    /// The last action before it (`None` = start).
    pub after: Option<Tag>,
    pub kind: ViolationKind,
    /// The tags that could have come at this position.
    pub expected: Vec<Tag>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let found = self.found.map_or("the end", Tag::open);
        let after = self
            .after
            .map_or("the start".to_string(), |t| t.open().to_string());
        let expected = list_tags(&self.expected);
        write!(f, "step {}: ", self.index)?;
        match &self.kind {
            ViolationKind::Unexpected => write!(f, "{found} cannot follow {after}; expected {expected}"),
            ViolationKind::MissingThink => write!(f, "{found} after {after} is not preceded by <think>; expected {expected}"),
            ViolationKind::AfterAnswer => write!(f, "{found} after <answer>; the answer ends the trajectory"),
            ViolationKind::UnexpectedEnd if self.after.is_none() => write!(f, "the trajectory is empty; expected {expected}"),
            ViolationKind::UnexpectedEnd => write!(f, "the trajectory ends after {after} without <answer>; expected {expected}"),
            ViolationKind::MissingObservation => write!(f, "tool call {found} has no observation"),
            ViolationKind::ObservationOnNonTool => write!(f, "{found} is not a tool call but carries an observation"),
            ViolationKind::BadReflection(e) => write!(f, "<reflection> has {e}"),
            ViolationKind::BadDoubleCheck(e) => write!(f, "<double_check> has {e}"),
            ViolationKind::PoorNotReplanned => write!(f, "{found} after a <reflection> graded Poor; expected <plan> (any Poor means re-plan)"),
            ViolationKind::ScoreNotFollowed(s) if *s >= 3 => {
                write!(f, "{found} after a <double_check> with score {s}; expected <answer> (a score of 3 or 4 means answer)")
            }
            ViolationKind::ScoreNotFollowed(s) => {
                write!(f, "{found} after a <double_check> with score {s}; a score of 1 or 2 means re-plan, search or crawl, not answer")
            }
        }
    }
}

impl std::error::Error for Violation {}

/// The ordering state machine; feed it tags one by one.
#[derive(Debug, Clone)]
pub struct Machine {
    flavor: Flavor,
    last: Option<Tag>,
    thought: bool,
}

impl Machine {
    pub fn new(flavor: Flavor) -> Machine {
        Machine {
            flavor,
            last: None,
            thought: false,
        }
    }

    /// The last action (`None` at the start).
    pub fn last(&self) -> Option<Tag> {
        self.last
    }

    /// Whether a `<think>` is pending.
    pub fn thought(&self) -> bool {
        self.thought
    }

    /// Whether the trajectory may end here.
    pub fn is_done(&self) -> bool {
        self.last == Some(Answer)
    }

    /// The tags that may come next.
    pub fn expected(&self) -> Vec<Tag> {
        let next = next_actions(self.flavor, self.last);
        let mut out = Vec::with_capacity(next.len() + 1);
        if self.thought {
            out.extend(
                next.iter()
                    .copied()
                    .filter(|&t| think_rule(self.flavor, t) != ThinkRule::Forbidden),
            );
        } else {
            if next.iter().any(|&t| think_rule(self.flavor, t) != ThinkRule::Forbidden) {
                out.push(Think);
            }
            out.extend(
                next.iter()
                    .copied()
                    .filter(|&t| think_rule(self.flavor, t) != ThinkRule::Required),
            );
        }
        out
    }

    /// Advances by one tag, or says why it may not come here (the machine is left unchanged).
    pub fn step(&mut self, tag: Tag) -> Result<(), ViolationKind> {
        if self.last == Some(Answer) {
            return Err(ViolationKind::AfterAnswer);
        }
        let next = next_actions(self.flavor, self.last);
        if tag == Think {
            if self.thought || !next.iter().any(|&t| think_rule(self.flavor, t) != ThinkRule::Forbidden) {
                return Err(ViolationKind::Unexpected);
            }
            self.thought = true;
            return Ok(());
        }
        if !next.contains(&tag) {
            return Err(ViolationKind::Unexpected);
        }
        match (think_rule(self.flavor, tag), self.thought) {
            (ThinkRule::Required, false) => return Err(ViolationKind::MissingThink),
            (ThinkRule::Forbidden, true) => return Err(ViolationKind::Unexpected),
            _ => {}
        }
        self.last = Some(tag);
        self.thought = false;
        Ok(())
    }

    /// Checks that the trajectory may end here.
    pub fn finish(&self) -> Result<(), ViolationKind> {
        if self.is_done() {
            Ok(())
        } else {
            Err(ViolationKind::UnexpectedEnd)
        }
    }

    fn violation(&self, index: usize, found: Option<Tag>, kind: ViolationKind) -> Violation {
        Violation {
            index,
            found,
            after: self.last,
            kind,
            expected: self.expected(),
        }
    }
}

/// Checks the order of a tag sequence (observations as their own tags); `index` in a violation is
/// the position in `tags`.
pub fn validate_tags(tags: impl IntoIterator<Item = Tag>, flavor: Flavor) -> Result<(), Violation> {
    let mut m = Machine::new(flavor);
    let mut n = 0;
    for (i, tag) in tags.into_iter().enumerate() {
        m.step(tag).map_err(|k| m.violation(i, Some(tag), k))?;
        n = i + 1;
    }
    m.finish().map_err(|k| m.violation(n, None, k))
}

/// One step of a trajectory, as the renderer and validator see it: a tool-call step carries its
/// observation; every other step has none. (A standalone `Observation` step is allowed so that
/// parsed text with a misplaced observation can be validated and rejected.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step<'a> {
    pub tag: Tag,
    /// The block's content; for `Code`, the Python source (the renderer adds the fence).
    pub content: &'a str,
    pub observation: Option<&'a str>,
}

impl<'a> Step<'a> {
    pub fn new(tag: Tag, content: &'a str) -> Step<'a> {
        Step {
            tag,
            content,
            observation: None,
        }
    }
    pub fn tool(tag: Tag, content: &'a str, observation: &'a str) -> Step<'a> {
        Step {
            tag,
            content,
            observation: Some(observation),
        }
    }
}

/// What the last graded step demands of the next action.
#[derive(Clone, Copy)]
enum Demand {
    None,
    Replan,
    Score(u8),
}

/// Checks a trajectory: the order of its tags (observations follow their tool steps) and the
/// contents that steer it (module docs). `index` in a violation is the step index.
pub fn validate(steps: &[Step<'_>], flavor: Flavor) -> Result<(), Violation> {
    let mut m = Machine::new(flavor);
    let mut demand = Demand::None;
    for (i, s) in steps.iter().enumerate() {
        let v = |m: &Machine, kind, expected: Option<Vec<Tag>>| {
            let mut out = m.violation(i, Some(s.tag), kind);
            if let Some(e) = expected {
                out.expected = e;
            }
            out
        };
        // Order first; then the content rules, reported against the state before this step.
        let before = m.clone();
        m.step(s.tag).map_err(|k| v(&m, k, None))?;
        if s.tag != Think {
            match demand {
                Demand::Replan if s.tag != Plan => {
                    return Err(v(
                        &before,
                        ViolationKind::PoorNotReplanned,
                        Some(vec![Plan]),
                    ))
                }
                Demand::Score(n) if (n >= 3) != (s.tag == Answer) => {
                    let expected = if n >= 3 {
                        vec![Answer]
                    } else {
                        vec![Plan, WebSearch, WikiSearch, CrawlPage]
                    };
                    return Err(v(
                        &before,
                        ViolationKind::ScoreNotFollowed(n),
                        Some(expected),
                    ));
                }
                _ => {}
            }
            demand = Demand::None;
        }
        match s.tag {
            DoubleCheck => match parse_double_check(s.content) {
                Ok(n) => demand = Demand::Score(n),
                Err(e) => {
                    return Err(v(
                        &before,
                        ViolationKind::BadDoubleCheck(e),
                        Some(Vec::new()),
                    ))
                }
            },
            Reflection if flavor != Flavor::Code => match parse_reflection(s.content) {
                Ok(g) if g.needs_replan() => demand = Demand::Replan,
                Ok(_) => {}
                Err(_) if !flavor.grades_reflections() => {}
                Err(e) => {
                    return Err(v(
                        &before,
                        ViolationKind::BadReflection(e),
                        Some(Vec::new()),
                    ))
                }
            },
            _ => {}
        }
        match (s.tag.is_tool(), s.observation.is_some()) {
            (true, true) => m.step(Observation).map_err(|k| v(&m, k, None))?,
            (true, false) => {
                return Err(v(
                    &before,
                    ViolationKind::MissingObservation,
                    Some(vec![Observation]),
                ))
            }
            (false, true) if s.tag != Observation => {
                return Err(v(
                    &before,
                    ViolationKind::ObservationOnNonTool,
                    Some(Vec::new()),
                ))
            }
            _ => {}
        }
    }
    m.finish().map_err(|k| m.violation(steps.len(), None, k))
}

/// Steps of parsed text: each tool-call segment absorbs the observation segment right after it.
pub fn steps_from_text(text: &str) -> Result<Vec<Step<'_>>, ParseError> {
    let segs = parse(text)?;
    let mut steps: Vec<Step<'_>> = Vec::with_capacity(segs.len());
    let mut it = segs.into_iter().peekable();
    while let Some(seg) = it.next() {
        let content = if seg.tag == Code {
            crate::parse::code_source(seg.content)
        } else {
            seg.content
        };
        let mut step = Step::new(seg.tag, content);
        if seg.tag.is_tool() {
            if let Some(obs) = it.next_if(|n| n.tag == Observation) {
                step.observation = Some(obs.content);
            }
        }
        steps.push(step);
    }
    Ok(steps)
}

/// Why CoA text is not a valid trajectory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextError {
    Parse(ParseError),
    Grammar(Violation),
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextError::Parse(e) => write!(f, "{e}"),
            TextError::Grammar(v) => write!(f, "{v}"),
        }
    }
}

impl std::error::Error for TextError {}

/// Parses and validates CoA text (what `coa-score` checks a model's response with). Violation
/// indices count steps as [`steps_from_text`] forms them.
pub fn validate_text(text: &str, flavor: Flavor) -> Result<(), TextError> {
    let steps = steps_from_text(text).map_err(TextError::Parse)?;
    validate(&steps, flavor).map_err(TextError::Grammar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_cover_every_reachable_state() {
        for flavor in Flavor::ALL {
            for (_, next) in flavor.transitions() {
                for &t in *next {
                    assert!(
                        flavor.transitions().iter().any(|(s, _)| *s == Some(t)),
                        "{flavor:?}: no row for {t}"
                    );
                }
            }
        }
    }

    #[test]
    fn expected_lists_think_first() {
        let mut m = Machine::new(Flavor::Web);
        assert_eq!(m.expected(), vec![Think]);
        m.step(Think).unwrap();
        assert_eq!(m.expected(), vec![Plan]);
        m.step(Plan).unwrap();
        m.step(Think).unwrap();
        m.step(SuggestedAnswer).unwrap();
        assert_eq!(m.expected(), vec![Think]);
        m.step(Think).unwrap();
        m.step(DoubleCheck).unwrap();
        assert_eq!(m.expected(), vec![Think, Answer]);
        assert_eq!(m.step(Observation), Err(ViolationKind::Unexpected));
        m.step(Answer).unwrap();
        assert!(m.finish().is_ok());
        assert_eq!(m.step(Think), Err(ViolationKind::AfterAnswer));
    }

    #[test]
    fn violation_messages_name_step_and_expectation() {
        let e = validate_tags([Think, Plan, Think, Answer], Flavor::Web).unwrap_err();
        assert_eq!(e.index, 3);
        assert_eq!(e.to_string(), "step 3: <answer> cannot follow <plan>; expected <web_search>, <wiki_search>, <crawl_page> or <suggested_answer>");
        let e = validate_tags([Think, Plan, WebSearch], Flavor::Web).unwrap_err();
        assert_eq!(
            e.to_string(),
            "step 2: <web_search> after <plan> is not preceded by <think>; expected <think>"
        );
        let e = validate_tags([], Flavor::Code).unwrap_err();
        assert_eq!(
            e.to_string(),
            "step 0: the trajectory is empty; expected <plan>"
        );
        let e = validate_tags([Plan], Flavor::Code).unwrap_err();
        assert_eq!(e.to_string(), "step 1: the trajectory ends after <plan> without <answer>; expected <think>");
        // The code agent's plan comes first and its reflection right after the observation.
        let e = validate_tags([Think, Plan], Flavor::Code).unwrap_err();
        assert_eq!(e.to_string(), "step 0: <think> cannot follow the start; expected <plan>");
        let e = validate_tags([Plan, Think, Code, Observation, Think, Reflection], Flavor::Code).unwrap_err();
        assert_eq!(e.to_string(), "step 4: <think> cannot follow <observation>; expected <reflection>");
        let e = validate_tags([Plan, Answer], Flavor::Code).unwrap_err();
        assert_eq!(e.to_string(), "step 1: <answer> after <plan> is not preceded by <think>; expected <think>");
    }

    #[test]
    fn qa_accepts_both_afm_qa_orders() {
        // AFM's multi-hop QA agent: no suggested answer, reflections without grades.
        let mhqa = [Think, Plan, Think, WikiSearch, Observation, Think, Reflection, Think, Answer];
        assert_eq!(validate_tags(mhqa, Flavor::Qa), Ok(()));
        assert!(validate_tags(mhqa, Flavor::Web).is_err());
        let direct = [Think, Plan, Think, WikiSearch, Observation, Think, Answer];
        assert_eq!(validate_tags(direct, Flavor::Qa), Ok(()));
        // AFM's web agent.
        let web = [Think, Plan, Think, WebSearch, Observation, Think, SuggestedAnswer, Think, DoubleCheck, Answer];
        assert_eq!(validate_tags(web, Flavor::Qa), Ok(()));
        assert_eq!(validate_tags(web, Flavor::Web), Ok(()));
        let steps = [
            Step::new(Think, "t"),
            Step::new(Plan, "p"),
            Step::new(Think, "t"),
            Step::tool(WikiSearch, "q", "Found 1 results:"),
            Step::new(Think, "t"),
            Step::new(Reflection, "The page names the director; the question is answered."),
            Step::new(Think, "t"),
            Step::new(Answer, "Wings"),
        ];
        assert_eq!(validate(&steps, Flavor::Qa), Ok(()));
        assert!(matches!(validate(&steps, Flavor::Web).unwrap_err().kind, ViolationKind::BadReflection(_) | ViolationKind::Unexpected));
    }

    #[test]
    fn contents_steer_the_order() {
        let grades_poor =
            "information_conflict: Good\ntool_effectiveness: Poor\ntrajectory_monitoring: Good";
        let steps = [
            Step::new(Think, "t"),
            Step::new(Plan, "p"),
            Step::new(Think, "t"),
            Step::tool(WebSearch, "q", "Found 0 results:"),
            Step::new(Think, "t"),
            Step::new(Reflection, grades_poor),
            Step::new(Think, "t"),
            Step::tool(WebSearch, "q2", "Found 1 results:"),
        ];
        let e = validate(&steps, Flavor::Web).unwrap_err();
        assert_eq!(e.kind, ViolationKind::PoorNotReplanned);
        assert_eq!(e.index, 7);
        assert_eq!(e.after, Some(Reflection));
        let e = validate(
            &[
                Step::new(Think, "t"),
                Step::new(Plan, "p"),
                Step::new(Think, "t"),
                Step::new(WebSearch, "q"),
            ],
            Flavor::Web,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "step 3: tool call <web_search> has no observation"
        );
    }

    #[test]
    fn text_validation() {
        let text = "<plan>p</plan>\n<think>b</think>\n<code>\n```py\nprint(1)\n```\n</code>\n\
                    <observation>1</observation>\n<reflection>ok</reflection>\n<think>c</think>\n<answer>\\boxed{1}</answer>";
        assert_eq!(validate_text(text, Flavor::Code), Ok(()));
        assert!(matches!(
            validate_text(text, Flavor::Web),
            Err(TextError::Grammar(_))
        ));
        assert!(matches!(
            validate_text("<think>", Flavor::Code),
            Err(TextError::Parse(_))
        ));
        let steps = steps_from_text(text).unwrap();
        assert_eq!(steps[2], Step::tool(Code, "print(1)", "1"));
    }
}
