//! apex's opt levels O0-O3 as a table of properties, plus the overrides
//! `amp.initialize` accepts (keep_batchnorm_fp32, master_weights, loss_scale).
//! The names and values are apex's (`apex/amp/frontend.py`), so a user who
//! knows apex reads the resolved policy without a translation table.

use crate::config::{AmpConfig, LossScale, OptLevel};
use crate::error::{Error, Result};
use crate::tensor::DType;

/// The resolved properties of an opt level after overrides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub opt_level: OptLevel,
    /// What the model is cast to: `Some(F32)` for O0, `None` (weights stay as
    /// built, fp32) for O1, `Some(F16)` for O2 and O3.
    pub cast_model_type: Option<DType>,
    /// O1: conv and linear run with f16 inputs and weights (cast per call),
    /// everything else in f32.
    pub patch_torch_functions: bool,
    /// `None` where apex leaves it unset (O0, O1: BatchNorm is fp32 anyway).
    pub keep_batchnorm_fp32: Option<bool>,
    /// `None` where apex leaves it unset (O1: the weights themselves are fp32).
    pub master_weights: Option<bool>,
    pub loss_scale: LossScale,
}

impl Policy {
    /// apex's table, without overrides.
    pub fn for_level(opt_level: OptLevel) -> Policy {
        match opt_level {
            OptLevel::O0 => Policy {
                opt_level,
                cast_model_type: Some(DType::F32),
                patch_torch_functions: false,
                keep_batchnorm_fp32: None,
                master_weights: Some(false),
                loss_scale: LossScale::Static(1.0),
            },
            OptLevel::O1 => Policy {
                opt_level,
                cast_model_type: None,
                patch_torch_functions: true,
                keep_batchnorm_fp32: None,
                master_weights: None,
                loss_scale: LossScale::Dynamic,
            },
            OptLevel::O2 => Policy {
                opt_level,
                cast_model_type: Some(DType::F16),
                patch_torch_functions: false,
                keep_batchnorm_fp32: Some(true),
                master_weights: Some(true),
                loss_scale: LossScale::Dynamic,
            },
            OptLevel::O3 => Policy {
                opt_level,
                cast_model_type: Some(DType::F16),
                patch_torch_functions: false,
                keep_batchnorm_fp32: Some(false),
                master_weights: Some(false),
                loss_scale: LossScale::Static(1.0),
            },
        }
    }

    /// The table for `amp.opt_level` with `[amp]`'s overrides applied. An
    /// override that makes no sense for the level is a config error naming
    /// the key (the caller attaches the file).
    pub fn resolve(amp: &AmpConfig) -> Result<Policy> {
        let mut p = Policy::for_level(amp.opt_level);
        let level = amp.opt_level;
        let bad = |key: &str, msg: String| Err(Error::config(String::new(), key, msg));
        if let Some(keep) = amp.keep_batchnorm_fp32 {
            match level {
                OptLevel::O0 => {
                    return bad(
                        "amp.keep_batchnorm_fp32",
                        format!("= {keep} makes no sense with O0: the whole model is fp32; remove it"),
                    )
                }
                OptLevel::O1 => {
                    return bad(
                        "amp.keep_batchnorm_fp32",
                        format!(
                            "= {keep} makes no sense with O1: BatchNorm already runs in fp32 (only conv \
                             and linear are cast); remove it (apex requires it to be None)"
                        ),
                    )
                }
                OptLevel::O2 | OptLevel::O3 => p.keep_batchnorm_fp32 = Some(keep),
            }
        }
        if let Some(master) = amp.master_weights {
            match level {
                OptLevel::O0 if master => {
                    return bad(
                        "amp.master_weights",
                        "= true makes no sense with O0: the weights are already fp32; remove it or pick O2"
                            .into(),
                    )
                }
                OptLevel::O1 => {
                    return bad(
                        "amp.master_weights",
                        format!(
                            "= {master} makes no sense with O1: the model weights themselves stay fp32; \
                             remove it (apex requires it to be None)"
                        ),
                    )
                }
                _ => p.master_weights = Some(master),
            }
        }
        if let Some(scale) = amp.loss_scale {
            p.loss_scale = scale;
        }
        Ok(p)
    }

    /// The dtype a parameter (and its grad) is stored in after the model cast.
    pub fn param_dtype(&self, is_batchnorm: bool) -> DType {
        match self.cast_model_type {
            Some(DType::F16) if is_batchnorm && self.keep_batchnorm_fp32 == Some(true) => DType::F32,
            Some(dt) => dt,
            None => DType::F32,
        }
    }

    /// The dtype the model's input is cast to (apex casts inputs to
    /// cast_model_type in the patched forward).
    pub fn input_dtype(&self) -> DType {
        self.cast_model_type.unwrap_or(DType::F32)
    }

    /// Whether the optimizer keeps fp32 master copies of the weights.
    pub fn uses_master_weights(&self) -> bool {
        self.master_weights == Some(true)
    }
}
