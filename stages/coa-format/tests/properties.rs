//! Property tests over random trajectories (hand-rolled seeded generator, no proptest):
//! render → parse round-trips, observation spans slice exactly the observation blocks (unicode
//! included), the validator accepts every well-formed trajectory and rejects each kind of
//! violation at the right step, and the parser reports each kind of error at the right position.

use coa_format::*;

/// splitmix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Characters that cannot spell a grade key or `score`, with multi-byte and combining ones and
/// markup-looking characters.
const ALPHABET: &[&str] = &[
    "a", "b", "x", "1", "7", ".", " ", " ", "\n", "\t", "<", ">", "/", "é", "中", "文", "🙂",
    "e\u{301}", "ß", "\"", "`", "{", "}", "|", "\\", "#", "<div>", "a < b", "</p>", "```",
];

/// Extra tokens for opaque bodies (code, observation): CoA tags are allowed there.
const OPAQUE_EXTRA: &[&str] = &["<think>", "</plan>", "<answer>", "<observation>", "</code"];

fn random_text(rng: &mut Rng, opaque: bool) -> String {
    let n = rng.below(30);
    let mut s = String::new();
    for _ in 0..n {
        if opaque && rng.chance(0.05) {
            s.push_str(rng.pick(OPAQUE_EXTRA));
        } else {
            s.push_str(rng.pick(ALPHABET));
        }
    }
    // An opaque body may hold anything but its own closing tag (the renderer refuses those).
    while s.contains("</code>") || s.contains("</observation>") {
        s = s.replace("</code>", "").replace("</observation>", "");
    }
    s
}

#[derive(Debug, Clone, PartialEq)]
struct Owned {
    tag: Tag,
    content: String,
    observation: Option<String>,
}

impl Owned {
    fn step(&self) -> Step<'_> {
        Step {
            tag: self.tag,
            content: &self.content,
            observation: self.observation.as_deref(),
        }
    }
}

fn steps(v: &[Owned]) -> Vec<Step<'_>> {
    v.iter().map(Owned::step).collect()
}

fn grades_text(rng: &mut Rng, allow_poor: bool) -> (String, bool) {
    let grades: Vec<Grade> = (0..3)
        .map(|_| {
            if allow_poor {
                rng.pick(&Grade::ALL)
            } else {
                rng.pick(&[Grade::Good, Grade::Fair])
            }
        })
        .collect();
    let poor = grades.contains(&Grade::Poor);
    let mut s = random_text(rng, false);
    s.push('\n');
    for (k, g) in REFLECTION_CRITERIA.iter().zip(&grades) {
        s.push_str(&format!("{k}: {g}\n"));
    }
    s.push_str(&random_text(rng, false));
    (s, poor)
}

/// A random well-formed trajectory: a walk over the transition table that honours the think rule
/// and the score/grade rules, steered to `<answer>` after a random budget of actions.
fn gen_trajectory(rng: &mut Rng, flavor: Flavor) -> Vec<Owned> {
    let mut m = Machine::new(flavor);
    let mut out = Vec::new();
    let budget = 1 + rng.below(14);
    let mut actions = 0;
    // What the last graded step demands: Some(true) = must answer, Some(false) = must not;
    // `replan` = must plan.
    let (mut must_answer, mut replan): (Option<bool>, bool) = (None, false);
    loop {
        let steer = actions >= budget;
        let mut next: Vec<Tag> = next_actions(flavor, m.last())
            .iter()
            .copied()
            .filter(|&t| t != Tag::Observation)
            .collect();
        if replan {
            next.retain(|&t| t == Tag::Plan);
        }
        match must_answer {
            Some(true) => next.retain(|&t| t == Tag::Answer),
            Some(false) => next.retain(|&t| t != Tag::Answer),
            None => {}
        }
        assert!(!next.is_empty(), "generator stuck after {:?}", m.last());
        let tag = if steer {
            [Tag::Answer, Tag::DoubleCheck, Tag::SuggestedAnswer]
                .into_iter()
                .find(|t| next.contains(t))
                .unwrap_or_else(|| rng.pick(&next))
        } else {
            rng.pick(&next)
        };
        match think_rule(flavor, tag) {
            ThinkRule::Required => out.push(Owned {
                tag: Tag::Think,
                content: random_text(rng, false),
                observation: None,
            }),
            ThinkRule::Optional if rng.chance(0.5) => out.push(Owned {
                tag: Tag::Think,
                content: random_text(rng, false),
                observation: None,
            }),
            _ => {}
        }
        if out.last().is_some_and(|s| s.tag == Tag::Think) {
            m.step(Tag::Think).unwrap();
        }
        let (mut next_must_answer, mut next_replan) = (None, false);
        let content = match tag {
            Tag::DoubleCheck => {
                let score = if steer {
                    3 + rng.below(2)
                } else {
                    1 + rng.below(4)
                };
                next_must_answer = Some(score >= 3);
                format!("{}\nscore: {score}", random_text(rng, false))
            }
            Tag::Reflection if flavor.grades_reflections() || flavor == Flavor::Qa && rng.chance(0.5) => {
                let (s, poor) = grades_text(rng, !steer);
                next_replan = poor;
                s
            }
            t => random_text(rng, t.is_opaque()),
        };
        let observation = tag.is_tool().then(|| random_text(rng, true));
        m.step(tag).unwrap();
        if tag.is_tool() {
            m.step(Tag::Observation).unwrap();
        }
        out.push(Owned {
            tag,
            content,
            observation,
        });
        must_answer = next_must_answer;
        replan = next_replan;
        actions += 1;
        if tag == Tag::Answer {
            return out;
        }
    }
}

fn chars(s: &str) -> Vec<char> {
    s.chars().collect()
}

fn slice(cs: &[char], span: Span) -> String {
    cs[span.start..span.end].iter().collect()
}

const FLAVORS: [Flavor; 3] = Flavor::ALL;
const N: u64 = 1500;

#[test]
fn render_parse_round_trip_and_spans() {
    let mut with_unicode_obs = 0;
    for flavor in FLAVORS {
        for seed in 0..N {
            let mut rng = Rng(seed * 2 + flavor as u64);
            let traj = gen_trajectory(&mut rng, flavor);
            let st = steps(&traj);
            let r = render(&st).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // Round trip.
            let back =
                steps_from_text(&r.text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", r.text));
            assert_eq!(back, st, "seed {seed} {flavor:?}\n{}", r.text);
            // Spans slice exactly the observation blocks, in order, in characters.
            let cs = chars(&r.text);
            let observations: Vec<&str> = traj
                .iter()
                .filter_map(|s| s.observation.as_deref())
                .collect();
            assert_eq!(r.observation_spans.len(), observations.len(), "seed {seed}");
            for (span, obs) in r.observation_spans.iter().zip(&observations) {
                assert_eq!(
                    slice(&cs, *span),
                    format!("<observation>{obs}</observation>"),
                    "seed {seed}"
                );
                if obs.len() != obs.chars().count() {
                    with_unicode_obs += 1;
                }
            }
            // The parser's segment spans agree with the renderer's, and slice the segments.
            let segs = parse(&r.text).unwrap();
            let seg_spans: Vec<Span> = segs
                .iter()
                .filter(|s| s.tag == Tag::Observation)
                .map(|s| s.span)
                .collect();
            assert_eq!(seg_spans, r.observation_spans, "seed {seed}");
            for s in &segs {
                assert_eq!(slice(&cs, s.span), &r.text[s.bytes.clone()]);
                assert_eq!(slice(&cs, s.content_span), s.content);
            }
            // render_to into another sink, after existing text, gives spans relative to its start.
            let mut buf = String::from("préfixe ");
            let mut spans = Vec::new();
            let n = render_to(&st, &mut buf, &mut spans).unwrap();
            assert_eq!(n, cs.len());
            assert_eq!(&buf["préfixe ".len()..], r.text);
            assert_eq!(spans, r.observation_spans);
        }
    }
    assert!(
        with_unicode_obs > 100,
        "unicode observations exercised only {with_unicode_obs} times"
    );
}

#[test]
fn validator_accepts_every_well_formed_trajectory() {
    for flavor in FLAVORS {
        for seed in 0..N {
            let traj = gen_trajectory(&mut Rng(seed * 7 + flavor as u64), flavor);
            let st = steps(&traj);
            if let Err(e) = validate(&st, flavor) {
                panic!("seed {seed} {flavor:?}: {e}\n{traj:#?}");
            }
            let text = render(&st).unwrap().text;
            assert_eq!(validate_text(&text, flavor), Ok(()), "seed {seed}");
            // The tag stream (observations as their own tags) passes the ordering machine too.
            let tags = st.iter().flat_map(|s| {
                std::iter::once(s.tag).chain(s.observation.map(|_| Tag::Observation))
            });
            assert_eq!(validate_tags(tags, flavor), Ok(()));
        }
    }
}

/// Each kind of violation, injected into random trajectories, is reported at the right step.
#[test]
fn validator_rejects_each_kind_of_violation() {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Inject {
        DropThink,
        DoubleThink,
        DropAnswer,
        AfterAnswer,
        DropObservation,
        ObservationOnNonTool,
        WrongAction,
        BadScore,
        ScoreIgnored,
        PoorIgnored,
        BadGrades,
        ObservationAlone,
    }
    let kinds = [
        Inject::DropThink,
        Inject::DoubleThink,
        Inject::DropAnswer,
        Inject::AfterAnswer,
        Inject::DropObservation,
        Inject::ObservationOnNonTool,
        Inject::WrongAction,
        Inject::BadScore,
        Inject::ScoreIgnored,
        Inject::PoorIgnored,
        Inject::BadGrades,
        Inject::ObservationAlone,
    ];
    let mut exercised = std::collections::BTreeMap::new();
    for flavor in FLAVORS {
        for seed in 0..N {
            let mut rng = Rng(seed * 13 + flavor as u64);
            let traj = gen_trajectory(&mut rng, flavor);
            for kind in kinds {
                let mut t = traj.clone();
                let th = |c: &str| Owned {
                    tag: Tag::Think,
                    content: c.into(),
                    observation: None,
                };
                // (index of the violation, expected kind), or None when not applicable here.
                let expect: Option<(usize, ViolationKind)> = match kind {
                    Inject::DropThink => {
                        let cands: Vec<usize> = (1..t.len())
                            .filter(|&i| {
                                t[i - 1].tag == Tag::Think
                                    && think_rule(flavor, t[i].tag) == ThinkRule::Required
                            })
                            .collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t.remove(i - 1);
                            (i - 1, ViolationKind::MissingThink)
                        })
                    }
                    Inject::DoubleThink => {
                        let i = (0..t.len()).find(|&i| t[i].tag == Tag::Think).unwrap();
                        t.insert(i, th("again"));
                        Some((i + 1, ViolationKind::Unexpected))
                    }
                    Inject::DropAnswer => {
                        t.pop();
                        if t.last().is_some_and(|s| s.tag == Tag::Think) {
                            t.pop();
                        }
                        Some((t.len(), ViolationKind::UnexpectedEnd))
                    }
                    Inject::AfterAnswer => {
                        let extra = rng.pick(&[Tag::Think, Tag::Plan, Tag::Answer, Tag::WebSearch]);
                        t.push(Owned {
                            tag: extra,
                            content: "x".into(),
                            observation: extra.is_tool().then(|| "o".into()),
                        });
                        Some((t.len() - 1, ViolationKind::AfterAnswer))
                    }
                    Inject::DropObservation => {
                        let cands: Vec<usize> =
                            (0..t.len()).filter(|&i| t[i].tag.is_tool()).collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t[i].observation = None;
                            (i, ViolationKind::MissingObservation)
                        })
                    }
                    Inject::ObservationOnNonTool => {
                        let cands: Vec<usize> = (0..t.len())
                            .filter(|&i| matches!(t[i].tag, Tag::Plan | Tag::SuggestedAnswer))
                            .collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t[i].observation = Some("leak".into());
                            (i, ViolationKind::ObservationOnNonTool)
                        })
                    }
                    Inject::WrongAction => {
                        // Replace an action by one the table does not allow after its predecessor.
                        let cands: Vec<usize> = (0..t.len())
                            .filter(|&i| t[i].tag != Tag::Think && t[i].tag != Tag::Answer)
                            .collect();
                        let i = rng.pick(&cands);
                        let prev = t[..i]
                            .iter()
                            .rev()
                            .map(|s| s.tag)
                            .find(|&x| x != Tag::Think);
                        let prev = match prev {
                            Some(p) if p.is_tool() => Some(Tag::Observation),
                            p => p,
                        };
                        let allowed = next_actions(flavor, prev);
                        let bad: Vec<Tag> = Tag::ALL
                            .into_iter()
                            .filter(|x| {
                                !allowed.contains(x)
                                    && *x != Tag::Think
                                    && *x != Tag::Observation
                                    && think_rule(flavor, *x) == ThinkRule::Required
                            })
                            .collect();
                        let b = rng.pick(&bad);
                        t[i] = Owned { tag: b, content: "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good\nscore: 4".into(), observation: b.is_tool().then(|| "o".into()) };
                        Some((i, ViolationKind::Unexpected))
                    }
                    Inject::BadScore => {
                        let cands: Vec<usize> = (0..t.len())
                            .filter(|&i| t[i].tag == Tag::DoubleCheck)
                            .collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t[i].content = rng
                                .pick(&["score: 5", "score: 0", "no verdict", "score: good"])
                                .into();
                            let e = parse_double_check(&t[i].content).unwrap_err();
                            (i, ViolationKind::BadDoubleCheck(e))
                        })
                    }
                    Inject::ScoreIgnored => {
                        // Flip a double_check's score across the 2/3 line: the next action disagrees.
                        let cands: Vec<usize> = (0..t.len())
                            .filter(|&i| t[i].tag == Tag::DoubleCheck)
                            .collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            let old = parse_double_check(&t[i].content).unwrap();
                            let new = if old >= 3 {
                                1 + rng.below(2) as u8
                            } else {
                                3 + rng.below(2) as u8
                            };
                            t[i].content = format!("flipped\nscore: {new}");
                            let next = (i + 1..t.len()).find(|&k| t[k].tag != Tag::Think).unwrap();
                            (next, ViolationKind::ScoreNotFollowed(new))
                        })
                    }
                    Inject::PoorIgnored => {
                        let cands: Vec<usize> = (0..t.len())
                            .filter(|&i| flavor == Flavor::Web && t[i].tag == Tag::Reflection)
                            .filter(|&i| {
                                t[i + 1..]
                                    .iter()
                                    .find(|s| s.tag != Tag::Think)
                                    .is_some_and(|s| s.tag != Tag::Plan)
                            })
                            .collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t[i].content = "information_conflict: Good\ntool_effectiveness: Poor\ntrajectory_monitoring: Fair".into();
                            let next = (i + 1..t.len()).find(|&k| t[k].tag != Tag::Think).unwrap();
                            (next, ViolationKind::PoorNotReplanned)
                        })
                    }
                    Inject::BadGrades => {
                        let cands: Vec<usize> = (0..t.len())
                            .filter(|&i| flavor == Flavor::Web && t[i].tag == Tag::Reflection)
                            .collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t[i].content =
                                "information_conflict: Good\ntrajectory_monitoring: Good".into();
                            (
                                i,
                                ViolationKind::BadReflection(GradeError::Missing(
                                    "tool_effectiveness",
                                )),
                            )
                        })
                    }
                    Inject::ObservationAlone => {
                        // An observation block that no tool call asked for, right after a plan.
                        let cands: Vec<usize> =
                            (0..t.len()).filter(|&i| t[i].tag == Tag::Plan).collect();
                        (!cands.is_empty()).then(|| {
                            let i = rng.pick(&cands);
                            t.insert(
                                i + 1,
                                Owned {
                                    tag: Tag::Observation,
                                    content: "ghost".into(),
                                    observation: None,
                                },
                            );
                            (i + 1, ViolationKind::Unexpected)
                        })
                    }
                };
                let Some((index, want)) = expect else {
                    continue;
                };
                let st = steps(&t);
                let err = validate(&st, flavor).expect_err(&format!(
                    "{kind:?} seed {seed} {flavor:?} accepted:\n{t:#?}"
                ));
                assert_eq!(
                    (err.index, &err.kind),
                    (index, &want),
                    "{kind:?} seed {seed} {flavor:?}: {err}\n{t:#?}"
                );
                assert!(!err.to_string().is_empty());
                // Grammar-only violations also surface through the text validator, same step.
                if let Ok(r) = render(&st) {
                    if let Err(TextError::Grammar(v)) = validate_text(&r.text, flavor) {
                        if kind != Inject::ObservationOnNonTool {
                            assert_eq!(v.index, index, "{kind:?} seed {seed}: text {v}");
                        }
                    } else {
                        panic!("{kind:?} seed {seed}: text validator accepted\n{}", r.text);
                    }
                }
                *exercised.entry(kind).or_insert(0) += 1;
            }
        }
    }
    for kind in kinds {
        assert!(
            exercised.get(&kind).copied().unwrap_or(0) >= 50,
            "{kind:?} exercised only {:?} times",
            exercised.get(&kind)
        );
    }
}

/// Each kind of parse error, injected into rendered text, is reported at the right character.
#[test]
fn parser_reports_each_kind_of_error_at_its_position() {
    for seed in 0..N {
        let mut rng = Rng(seed + 99);
        let flavor = FLAVORS[rng.below(FLAVORS.len())];
        let traj = gen_trajectory(&mut rng, flavor);
        let text = render(&steps(&traj)).unwrap().text;
        let segs = parse(&text).unwrap();
        let seg = &segs[rng.below(segs.len())];
        let char_at = |byte: usize| text[..byte].chars().count();

        // Unclosed: cut the text inside a block; reported at that block's opening tag.
        let cut = seg.bytes.end - 1;
        let e = parse(&text[..cut]).unwrap_err();
        assert_eq!(
            (e.kind.clone(), e.char),
            (ParseErrorKind::Unclosed(seg.tag), seg.span.start),
            "seed {seed}"
        );

        // Stray closing tag between blocks.
        let mut t = text.clone();
        t.insert_str(seg.bytes.end, "\n</plan>");
        let e = parse(&t).unwrap_err();
        assert_eq!(
            (e.kind, e.char),
            (ParseErrorKind::StrayClose(Tag::Plan), seg.span.end + 1),
            "seed {seed}"
        );

        // Unknown tag between blocks.
        let mut t = text.clone();
        t.insert_str(seg.bytes.start, "<tool_call>x</tool_call>\n");
        let e = parse(&t).unwrap_err();
        assert_eq!(
            (e.kind, e.char),
            (
                ParseErrorKind::UnknownTag("<tool_call>".into()),
                seg.span.start
            ),
            "seed {seed}"
        );

        // Text outside tags.
        let mut t = text.clone();
        t.insert_str(seg.bytes.end, " ünd");
        let e = parse(&t).unwrap_err();
        assert_eq!(
            (e.kind, e.char),
            (
                ParseErrorKind::TextOutsideTags("ünd".into()),
                seg.span.end + 1
            ),
            "seed {seed}"
        );

        // Nested / mismatched tags inside a non-opaque body.
        if !seg.tag.is_opaque() {
            let inner = rng.pick(&[Tag::Plan, Tag::Answer, Tag::Observation, Tag::Think]);
            let at = seg.bytes.start + seg.tag.open().len();
            let mut t = text.clone();
            t.insert_str(at, inner.open());
            let e = parse(&t).unwrap_err();
            assert_eq!(
                (e.kind, e.char),
                (
                    ParseErrorKind::Nested {
                        outer: seg.tag,
                        inner
                    },
                    char_at(at)
                ),
                "seed {seed}"
            );
            if inner != seg.tag {
                let mut t = text.clone();
                t.insert_str(at, inner.close());
                let e = parse(&t).unwrap_err();
                assert_eq!(
                    (e.kind, e.char),
                    (
                        ParseErrorKind::Mismatched {
                            open: seg.tag,
                            close: inner
                        },
                        char_at(at)
                    ),
                    "seed {seed}"
                );
            }
        }
    }
}
