//! A model's linear weights packed once for decoding.

use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::params::{layout, Params};
use crate::quant::DecodeDtype;
use crate::sgemm::PackedB;

/// A model's linear weights packed once for decoding (the head included), in one
/// [`DecodeDtype`]: per tensor index of `Params::tensors`, the packed weight, or `None` for
/// tensors that are not a linear layer's. Built on the model's first decode call
/// (`Model::decode_weights`) or by `Model::prepare_decoding_as`; `None` as a whole where the CPU
/// has no packed kernel.
pub(crate) struct DecodeWeights {
    pub(crate) dtype: DecodeDtype,
    pub(crate) packed: Vec<Option<PackedB>>,
}

impl std::fmt::Debug for DecodeWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DecodeWeights {{ {} packed, {} }}", self.packed.iter().flatten().count(), self.dtype)
    }
}

impl DecodeWeights {
    /// Packs every linear layer's weight of a model (`config`, `params`) and its head in `dtype`;
    /// `None` without a packed kernel.
    pub(crate) fn new(config: &ModelConfig, params: &Params, dtype: DecodeDtype) -> Option<DecodeWeights> {
        let lay = layout(config);
        let mut linears: Vec<usize> = lay.layers.iter().flat_map(|li| [li.wq, li.wk, li.wv, li.wo, li.wg, li.wu, li.wd]).collect();
        linears.push(lay.lm_head.unwrap_or(lay.embed));
        let tensors = &params.tensors;
        // Each [out, in] weight as the B operand of x · wᵀ.
        let built: Vec<Option<PackedB>> =
            linears.par_iter().map(|&t| PackedB::new_as(&tensors[t].data, tensors[t].shape[0], tensors[t].shape[1], dtype)).collect();
        let mut packed: Vec<Option<PackedB>> = (0..tensors.len()).map(|_| None).collect();
        for (&t, pw) in linears.iter().zip(built) {
            packed[t] = Some(pw?);
        }
        Some(DecodeWeights { dtype, packed })
    }
}
