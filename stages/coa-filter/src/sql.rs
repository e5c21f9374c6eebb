//! `--where EXPR`: user rules as polars SQL expressions over the table's columns.
//!
//! An expression is parsed once (`polars::sql::sql_expr`), its columns are checked against the
//! input schema, and its result type is checked on an empty frame, all before any row is read.
//! Evaluation converts only the columns the expression names (and only the rows still alive)
//! through the C Data Interface, evaluates the expression in polars, and returns a keep mask:
//! SQL semantics, so a null result drops the row. Aggregates (`hops > avg(hops)`) see every row
//! that reached the rule, because the stage evaluates `--where` on the whole table.

use std::collections::BTreeSet;

use anyhow::{anyhow, bail, Result};
use arrow::array::{new_empty_array, Array, ArrayRef, AsArray, BooleanArray};
use arrow::datatypes::{DataType, Schema};
use polars::prelude::{DataType as PlDataType, Expr, IntoLazy};

use crate::ffi;

/// One parsed `--where` expression.
#[derive(Clone)]
pub struct WhereRule {
    /// The expression as the user wrote it.
    pub text: String,
    expr: Expr,
    /// Columns it reads (indices into the input schema), in schema order.
    columns: Vec<usize>,
}

const MASK: &str = "__coa_filter_keep";

impl WhereRule {
    /// Parses `text` and checks it against `schema`: known columns, a boolean result.
    pub fn parse(text: &str, schema: &Schema) -> Result<WhereRule> {
        let context = || format!("--where `{text}`");
        if text.trim().is_empty() {
            bail!("{}: empty expression", context());
        }
        check_one_expression(text).map_err(|e| anyhow!("{}: {e}", context()))?;
        let expr = polars::sql::sql_expr(text).map_err(|e| anyhow!("{}: not a valid SQL expression: {e}", context()))?;
        let mut names = BTreeSet::new();
        let mut all = false;
        for node in &expr {
            match node {
                Expr::Column(name) => {
                    names.insert(name.to_string());
                }
                Expr::Selector(_) => all = true,
                _ => {}
            }
        }
        let mut columns = Vec::new();
        if all {
            columns = (0..schema.fields().len()).collect();
        } else {
            for name in &names {
                match schema.index_of(name) {
                    Ok(i) => columns.push(i),
                    Err(_) => {
                        let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                        bail!("{}: unknown column `{name}` (the input's columns: {})", context(), known.join(", "));
                    }
                }
            }
            columns.sort_unstable();
        }
        let rule = WhereRule { text: text.to_string(), expr, columns };
        // Evaluate once on an empty frame of the right types: catches type errors and
        // non-boolean results before any data is read.
        let empty: Vec<Vec<ArrayRef>> = rule.columns.iter().map(|&i| vec![new_empty_array(schema.field(i).data_type())]).collect();
        let out = rule.evaluate_raw(schema, 0, &empty).map_err(|e| anyhow!("{}: {e:#}", context()))?;
        if !matches!(out.dtype(), PlDataType::Boolean | PlDataType::Null) {
            bail!("{}: evaluates to {}, expected a condition (true keeps the row)", context(), out.dtype());
        }
        Ok(rule)
    }

    /// The input columns the expression reads.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    fn evaluate_raw(&self, schema: &Schema, height: usize, chunks: &[Vec<ArrayRef>]) -> Result<polars::prelude::Series> {
        let named: Vec<(&str, Vec<ArrayRef>)> =
            self.columns.iter().zip(chunks).map(|(&i, c)| (schema.field(i).name().as_str(), c.clone())).collect();
        let df = ffi::dataframe(height, &named)?;
        let out = df.lazy().select([self.expr.clone().alias(MASK)]).collect().map_err(|e| anyhow!("{e}"))?;
        let series = out.column(MASK).map_err(|e| anyhow!("{e}"))?.as_materialized_series().clone();
        Ok(series)
    }

    /// The keep mask over `height` rows whose needed columns are `chunks` (one list of chunks per
    /// entry of [`WhereRule::columns`]). Null results are `false`.
    pub fn evaluate(&self, schema: &Schema, height: usize, chunks: &[Vec<ArrayRef>]) -> Result<Vec<bool>> {
        let context = || format!("--where `{}`", self.text);
        let series = self.evaluate_raw(schema, height, chunks).map_err(|e| anyhow!("{}: {e:#}", context()))?;
        let arrow = ffi::series_to_arrow(&series)?;
        let mask: BooleanArray = match arrow.data_type() {
            DataType::Boolean => arrow.as_boolean().clone(),
            DataType::Null => BooleanArray::new_null(arrow.len()),
            other => bail!("{}: evaluates to {other}, expected a condition", context()),
        };
        let get = |i: usize| mask.is_valid(i) && mask.value(i);
        match mask.len() {
            n if n == height => Ok((0..n).map(get).collect()),
            // A scalar (a literal, or an aggregate alone) applies to every row.
            1 => Ok(vec![get(0); height]),
            n => bail!("{}: gives {n} values for {height} rows; use a row-wise condition", context()),
        }
    }
}

/// The whole text must be one condition: polars reads the first expression (or `expr alias`)
/// and silently ignores whatever follows (`hops > 100; garbage`, `hops > 100 garbage`).
fn check_one_expression(text: &str) -> Result<()> {
    use sqlparser::dialect::GenericDialect;
    use sqlparser::parser::Parser;
    use sqlparser::tokenizer::Token;
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(text).map_err(|e| anyhow!("not a valid SQL expression: {e}"))?;
    parser.parse_expr().map_err(|e| anyhow!("not a valid SQL expression: {e}"))?;
    match parser.peek_token().token {
        Token::EOF => Ok(()),
        next => bail!("unexpected `{next}` after the condition; give one condition per --where (join conditions with AND / OR)"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::Field;

    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![Field::new("hops", DataType::Int32, false), Field::new("suite", DataType::Utf8, false), Field::new("x", DataType::Int32, true)])
    }

    fn eval(text: &str) -> Result<Vec<bool>> {
        let schema = schema();
        let rule = WhereRule::parse(text, &schema)?;
        let all: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![3, 7, 25, 5])),
            Arc::new(StringArray::from(vec!["multihop", "multihop", "multihop", "math"])),
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3), Some(4)])),
        ];
        let chunks: Vec<Vec<ArrayRef>> = rule.columns().iter().map(|&i| vec![all[i].clone()]).collect();
        rule.evaluate(&schema, 4, &chunks)
    }

    #[test]
    fn row_wise_conditions() {
        assert_eq!(eval("hops <= 20 AND suite = 'multihop'").unwrap(), vec![true, true, false, false]);
        assert_eq!(eval("suite IN ('math', 'code')").unwrap(), vec![false, false, false, true]);
        assert_eq!(eval("hops BETWEEN 5 AND 7").unwrap(), vec![false, true, false, true]);
    }

    #[test]
    fn null_results_drop_the_row() {
        assert_eq!(eval("x > 0").unwrap(), vec![true, false, true, true]);
        assert_eq!(eval("x IS NULL").unwrap(), vec![false, true, false, false]);
    }

    #[test]
    fn only_named_columns_are_read() {
        let rule = WhereRule::parse("suite = 'math'", &schema()).unwrap();
        assert_eq!(rule.columns(), &[1]);
        let rule = WhereRule::parse("1 = 1", &schema()).unwrap();
        assert!(rule.columns().is_empty());
        assert_eq!(eval("1 = 1").unwrap(), vec![true; 4]);
    }

    #[test]
    fn aggregates_see_the_whole_input() {
        // mean(hops) = 10
        assert_eq!(eval("hops > avg(hops)").unwrap(), vec![false, false, true, false]);
    }

    #[test]
    fn malformed_expressions_are_named() {
        let e = eval("hops <= AND").unwrap_err().to_string();
        assert!(e.contains("--where `hops <= AND`"), "{e}");
        let e = eval("").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn trailing_text_is_refused() {
        for text in ["hops > 100; garbage", "hops > 100 garbage", "hops > 1 AND suite = 'math' extra", "hops > 1;"] {
            let e = eval(text).unwrap_err().to_string();
            assert!(e.contains("after the condition") && e.contains(text), "{text}: {e}");
        }
        assert_eq!(eval("hops > 100 -- a comment").unwrap(), vec![false; 4]);
    }

    #[test]
    fn unknown_columns_are_named() {
        let e = eval("nope > 3 AND hops > 1").unwrap_err().to_string();
        assert!(e.contains("unknown column `nope`") && e.contains("hops, suite, x"), "{e}");
    }

    #[test]
    fn non_boolean_results_are_refused() {
        let e = eval("hops + 1").unwrap_err().to_string();
        assert!(e.contains("expected a condition"), "{e}");
        let e = eval("suite > 3").map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("--where `suite > 3`"), "{e}");
    }
}
