//! Retracted steps: tool calls that the trajectory itself judges a misstep.
//!
//! A teacher's trajectory may try something, see it fail and recover: a program with a bug, a
//! page that is not the one the hop needs. Distillation wants the recovery (the reflection that
//! notices, the corrected call) but not the misstep, which a student trained on it learns to make.
//! A tool call is *retracted* when the first reflection after its observation, before any other
//! action but thinking, grades `trajectory_monitoring` below Good: the trajectory's own monitor
//! says that call took it off track. Its step is the call and the `<think>` right before it (the
//! think argues for the call, e.g. "this result looks like the page I need"); `coa-tokenize
//! --mask-retracted` keeps such steps out of the loss while the rest stays a target.

use crate::grade::{parse_reflection, Grade};
use crate::parse::{Segment, Span};
use crate::tag::{Tag, TagKind};

/// Character spans of the retracted steps of parsed CoA text, in order: each from the start of the
/// `<think>` right before the tool call (or of the call) to the end of the call's closing tag.
/// The spans never touch the observations, so they are disjoint from `observation_spans`.
pub fn retracted_steps(segments: &[Segment<'_>]) -> Vec<Span> {
    let mut out = Vec::new();
    for (i, call) in segments.iter().enumerate() {
        if call.tag.kind() != TagKind::Tool || segments.get(i + 1).map(|s| s.tag) != Some(Tag::Observation) {
            continue;
        }
        let judged_off_track = segments[i + 2..]
            .iter()
            .find(|s| s.tag != Tag::Think)
            .filter(|s| s.tag == Tag::Reflection)
            .and_then(|s| parse_reflection(s.content).ok())
            .is_some_and(|g| g.trajectory_monitoring != Grade::Good);
        if judged_off_track {
            let start = match i.checked_sub(1).map(|p| &segments[p]) {
                Some(think) if think.tag == Tag::Think => think.span.start,
                _ => call.span.start,
            };
            out.push(Span { start, end: call.span.end });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn reflection(monitoring: &str) -> String {
        format!("<reflection>information_conflict: Fair\ntool_effectiveness: Good\ntrajectory_monitoring: {monitoring}\nIt must be fixed.</reflection>")
    }

    fn spans_of(text: &str) -> Vec<&str> {
        let segs = parse(text).unwrap();
        let chars: Vec<char> = text.chars().collect();
        retracted_steps(&segs).iter().map(|s| {
            let a: usize = chars[..s.start].iter().map(|c| c.len_utf8()).sum();
            let b: usize = chars[..s.end].iter().map(|c| c.len_utf8()).sum();
            &text[a..b]
        }).collect()
    }

    #[test]
    fn a_call_its_reflection_grades_off_track_is_retracted_with_its_think() {
        let text = format!(
            "<plan>1. compute</plan>\n<think>I will compute it.</think>\n<code>print(1)</code>\n<observation>1</observation>\n\
<think>Does it answer the question?</think>\n{}\n<think>Rewrite it.</think>\n<code>print(2)</code>\n<observation>2</observation>\n\
<think>Check.</think>\n{}\n<answer>2</answer>",
            reflection("Fair"),
            reflection("Good")
        );
        assert_eq!(spans_of(&text), vec!["<think>I will compute it.</think>\n<code>print(1)</code>"]);
    }

    #[test]
    fn poor_counts_and_a_call_without_a_think_is_retracted_alone() {
        let text = format!("<plan>p</plan>\n<web_search>q é</web_search>\n<observation>hits</observation>\n{}\n<answer>a</answer>", reflection("Poor"));
        assert_eq!(spans_of(&text), vec!["<web_search>q é</web_search>"]);
    }

    #[test]
    fn calls_the_next_reflection_does_not_judge_are_kept() {
        // Good monitoring; another call before any reflection; no reflection at all; ungraded.
        let good = format!("<think>t</think>\n<code>a</code>\n<observation>o</observation>\n{}\n<answer>a</answer>", reflection("Good"));
        let call_first = format!("<code>a</code>\n<observation>o</observation>\n<code>b</code>\n<observation>o</observation>\n{}", reflection("Good"));
        let none = "<code>a</code>\n<observation>o</observation>\n<answer>a</answer>";
        let ungraded = "<code>a</code>\n<observation>o</observation>\n<reflection>Looks wrong.</reflection>\n<answer>a</answer>";
        for text in [good.as_str(), call_first.as_str(), none, ungraded] {
            assert!(spans_of(text).is_empty(), "{text}");
        }
        // Only the call right before the off-track reflection is retracted.
        let second = format!("<code>a</code>\n<observation>o</observation>\n<code>b</code>\n<observation>o</observation>\n{}", reflection("Fair"));
        assert_eq!(spans_of(&second), vec!["<code>b</code>"]);
    }
}
