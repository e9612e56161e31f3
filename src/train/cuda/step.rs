//! apex's optimizer step on the device, the twin of [`crate::amp::Amp::step`]:
//! unscale every gradient bucket into f32 (one fused pass that also sets the
//! overflow flag), move the loss scale, take the gradient norm and clip, then
//! the fused optimizer per dtype group, on fp32 masters (O2) or on the
//! model's own values. Every launch is on the compute stream and nothing
//! comes back to the host: the optimizer kernels read the overflow flag.
//!
//! The host mirrors (the CPU [`Model`], [`Optimizer`] and [`Amp`]) are
//! brought up to date only where the host needs them: checkpoints, traces,
//! the end of the run ([`DeviceStep::sync_to_host`]).

use crate::amp::cuda::{clip_grad_norm_, grad_norm_sq, DeviceScaler, ScalerSnapshot, NORM_PARTIALS};
use crate::amp::Amp;
use crate::cuda::{cast, Gpu};
use crate::error::{Error, Result};
use crate::nn::cuda::params::{DevBuf, DeviceParams};
use crate::optim::cuda::DeviceOptimizer;
use crate::optim::Optimizer;
use crate::tensor::DType;
use cudarc::driver::{CudaSlice, CudaView};
use std::path::Path;

/// One dtype group's optimizer state and scratch.
struct GroupStep {
    /// f32 gradients of the group after unscaling, in the group's layout.
    unscaled: CudaSlice<f32>,
    /// fp32 masters (apex master_weights), in the group's layout.
    master: Option<CudaSlice<f32>>,
    /// f16 values without masters (O3): widened here for the update.
    wide: Option<CudaSlice<f32>>,
    opt: DeviceOptimizer,
}

pub struct DeviceStep {
    pub scaler: DeviceScaler,
    groups: Vec<GroupStep>,
    norm_sq: CudaSlice<f32>,
    workspace: CudaSlice<f32>,
    /// loss scale / grad_accum_steps, refreshed after every scaler update
    /// (unused without accumulation).
    grad_scale: CudaSlice<f32>,
    accum: f32,
    clip: Option<f32>,
    pub snapshot: ScalerSnapshot,
}

fn alloc(gpu: &Gpu, n: usize) -> Result<CudaSlice<f32>> {
    gpu.stream().alloc_zeros::<f32>(n.max(1)).map_err(|e| Error::cuda("allocating optimizer buffers", e))
}

/// The part of `host`'s state that belongs to the parameters `members`
/// (registration indices, in the group's layout order), as an optimizer over
/// just those.
fn group_optimizer(host: &Optimizer, members: &[usize]) -> Result<Optimizer> {
    let sizes: Vec<usize> = members.iter().map(|&i| host.param_sizes()[i]).collect();
    let decay: Vec<bool> = members.iter().map(|&i| host.decay()[i]).collect();
    let mut g = Optimizer::new(host.config().clone(), &sizes)?.with_decay_mask(&decay)?;
    let tensors: Vec<(&str, usize, &[f32])> = host
        .state_tensors()
        .into_iter()
        .filter_map(|(name, i, v)| members.iter().position(|&m| m == i).map(|k| (name, k, v)))
        .collect();
    g.load_state_tensors(Path::new("<optimizer state>"), host.step_count(), &tensors)?;
    Ok(g)
}

/// Inverse of [`group_optimizer`]: the state of every group's optimizer
/// (`(members, optimizer)`) put back into `host`, parameter by parameter.
fn merge_optimizers(host: &mut Optimizer, groups: &[(&[usize], Optimizer)]) -> Result<()> {
    let step_count = groups.first().map_or(0, |(_, o)| o.step_count());
    let mut tensors: Vec<(&str, usize, &[f32])> = Vec::new();
    for (members, g) in groups {
        for (name, k, v) in g.state_tensors() {
            tensors.push((name, members[k], v));
        }
    }
    host.load_state_tensors(Path::new("<device optimizer>"), step_count, &tensors)
}

impl DeviceStep {
    /// The device twin of the host's optimizer, masters and scaler (after a
    /// resume, with their restored state).
    pub fn new(
        gpu: &Gpu,
        params: &DeviceParams,
        host_opt: &Optimizer,
        amp: &Amp,
        accum: usize,
        clip: Option<f32>,
    ) -> Result<Self> {
        let scaler_state = amp.scaler.state();
        let mut scaler = if amp.scaler.is_dynamic() {
            DeviceScaler::dynamic(gpu, amp.scaler.config())?
        } else {
            DeviceScaler::fixed(gpu, scaler_state.scale)?
        };
        scaler.load_state(gpu, scaler_state)?;
        let mut groups = Vec::with_capacity(params.groups.len());
        for g in &params.groups {
            let opt = DeviceOptimizer::from_host(gpu, &group_optimizer(host_opt, &g.params)?)?;
            let master = match amp.masters() {
                Some(m) => {
                    let flat: Vec<f32> =
                        g.params.iter().flat_map(|&i| m.masters()[i].iter().copied()).collect();
                    Some(
                        gpu.stream()
                            .clone_htod(&flat)
                            .map_err(|e| Error::cuda("copying master weights", e))?,
                    )
                }
                None => None,
            };
            let wide =
                (master.is_none() && g.dtype == DType::F16).then(|| alloc(gpu, g.numel)).transpose()?;
            groups.push(GroupStep { unscaled: alloc(gpu, g.numel)?, master, wide, opt });
        }
        let mut me = DeviceStep {
            scaler,
            groups,
            norm_sq: alloc(gpu, 1)?,
            workspace: alloc(gpu, NORM_PARTIALS)?,
            grad_scale: alloc(gpu, 1)?,
            accum: accum.max(1) as f32,
            clip,
            snapshot: ScalerSnapshot::new(gpu)?,
        };
        me.refresh_grad_scale(gpu)?;
        me.scaler.snapshot(gpu, &mut me.snapshot)?;
        Ok(me)
    }

    /// What the loss gradient is multiplied by: the loss scale over the
    /// accumulation steps (one f32 on the device).
    pub fn grad_scale(&self) -> CudaView<'_, f32> {
        if self.accum == 1.0 {
            self.scaler.scale().as_view()
        } else {
            self.grad_scale.as_view()
        }
    }

    /// Without accumulation the loss scale itself is the factor: no launch.
    fn refresh_grad_scale(&mut self, gpu: &Gpu) -> Result<()> {
        if self.accum == 1.0 {
            return Ok(());
        }
        self.scaler.divided_scale(gpu, self.accum, &mut self.grad_scale)
    }

    /// The squared total gradient norm of the last step (one f32 on the device).
    pub fn norm_sq(&self) -> &CudaSlice<f32> {
        &self.norm_sq
    }

    /// Optimizer step `step` (1-based) at learning rate `lr` from the
    /// gradients in `params`' buckets (all-reduced already, with the ranks'
    /// stop `vote` when there are several: the snapshot carries it to the host).
    pub fn step(
        &mut self,
        gpu: &Gpu,
        params: &mut DeviceParams,
        lr: f32,
        step: u64,
        vote: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        self.scaler.begin_step(gpu)?;
        for b in &params.buckets {
            let g = &mut self.groups[b.group];
            let n = b.layout.numel;
            let mut out = g.unscaled.slice_mut(b.group_offset..b.group_offset + n);
            match &b.grads {
                DevBuf::F32(s) => self.scaler.unscale(gpu, &s.slice(0..n), &mut out)?,
                DevBuf::F16(s) => self.scaler.unscale(gpu, &s.slice(0..n), &mut out)?,
            }
        }
        self.scaler.update(gpu, step)?;
        for (k, g) in self.groups.iter_mut().enumerate() {
            let n = params.groups[k].numel;
            grad_norm_sq(
                gpu,
                &g.unscaled.slice(0..n),
                &mut self.workspace.as_view_mut(),
                &mut self.norm_sq.as_view_mut(),
                k > 0,
            )?;
        }
        if let Some(max_norm) = self.clip {
            for (k, g) in self.groups.iter_mut().enumerate() {
                let n = params.groups[k].numel;
                let norm = self.norm_sq.as_view();
                clip_grad_norm_(
                    gpu,
                    &mut g.unscaled.slice_mut(0..n),
                    &norm,
                    max_norm,
                    self.scaler.found_inf(),
                )?;
            }
        }
        for (k, g) in self.groups.iter_mut().enumerate() {
            let pg = &mut params.groups[k];
            let n = pg.numel;
            let grads = g.unscaled.slice(0..n);
            let found_inf = self.scaler.found_inf();
            match (&mut g.master, &mut g.wide, &mut pg.values) {
                (Some(m), _, DevBuf::F32(v)) => g.opt.step(
                    gpu,
                    &mut m.slice_mut(0..n),
                    &grads,
                    Some(&mut v.slice_mut(0..n)),
                    lr,
                    found_inf,
                )?,
                (Some(m), _, DevBuf::F16(v)) => g.opt.step(
                    gpu,
                    &mut m.slice_mut(0..n),
                    &grads,
                    Some(&mut v.slice_mut(0..n)),
                    lr,
                    found_inf,
                )?,
                (None, _, DevBuf::F32(v)) => {
                    g.opt.step::<f32>(gpu, &mut v.slice_mut(0..n), &grads, None, lr, found_inf)?
                }
                (None, Some(w), DevBuf::F16(v)) => {
                    cast::f16_to_f32(gpu, &v.slice(0..n), &mut w.slice_mut(0..n))?;
                    g.opt.step(
                        gpu,
                        &mut w.slice_mut(0..n),
                        &grads,
                        Some(&mut v.slice_mut(0..n)),
                        lr,
                        found_inf,
                    )?
                }
                (None, None, DevBuf::F16(_)) => {
                    return Err(Error::internal("f16 group without its f32 scratch"))
                }
            }
        }
        self.refresh_grad_scale(gpu)?;
        if let Some(v) = vote {
            self.snapshot.copy_vote(gpu, v)?;
        }
        self.scaler.snapshot(gpu, self.snapshot.at_step(step))?;
        Ok(())
    }

    /// Brings the host's optimizer state, masters and loss scaler up to date
    /// with the device (waits for the stream). The model's values and
    /// buffers are the GPU model's to download.
    pub fn sync_to_host(
        &self,
        gpu: &Gpu,
        params: &DeviceParams,
        host_opt: &mut Optimizer,
        amp: &mut Amp,
    ) -> Result<()> {
        amp.scaler.load_state(self.scaler.state(gpu)?);
        let groups = self
            .groups
            .iter()
            .zip(&params.groups)
            .map(|(g, pg)| Ok((pg.params.as_slice(), g.opt.to_host(gpu)?)))
            .collect::<Result<Vec<_>>>()?;
        merge_optimizers(host_opt, &groups)?;
        if let Some(m) = amp.masters_mut() {
            let mut masters: Vec<Vec<f32>> = m.masters().to_vec();
            for (g, pg) in self.groups.iter().zip(&params.groups) {
                let Some(dev) = &g.master else { continue };
                let flat =
                    gpu.stream().clone_dtoh(dev).map_err(|e| Error::cuda("reading master weights", e))?;
                for &i in &pg.params {
                    let s = &params.slots[i];
                    masters[i].copy_from_slice(&flat[s.offset..s.offset + s.numel]);
                }
            }
            m.load(masters)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::OptimizerConfig;

    /// Splitting the host optimizer into dtype groups (in any member order)
    /// and merging them back gives the same state, for SGD with momentum and Adam.
    #[test]
    fn group_optimizers_split_and_merge_back_exactly() {
        let sizes = [3usize, 2, 4, 1];
        for cfg in
            [OptimizerConfig { momentum: 0.9, ..OptimizerConfig::sgd(0.1) }, OptimizerConfig::adam(0.01)]
        {
            let mut host = Optimizer::new(cfg.clone(), &sizes).unwrap();
            let mut params: Vec<Vec<f32>> =
                sizes.iter().map(|&n| (0..n).map(|i| i as f32 * 0.5 - 1.0).collect()).collect();
            let grads: Vec<Vec<f32>> =
                sizes.iter().map(|&n| (0..n).map(|i| 0.1 * i as f32 + 0.3).collect()).collect();
            for _ in 0..2 {
                let mut views: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
                let g: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
                host.step(&mut views, &g, 0.1).unwrap();
            }
            let (a, b): (Vec<usize>, Vec<usize>) = (vec![3, 1], vec![2, 0]);
            let groups = [
                (a.as_slice(), group_optimizer(&host, &a).unwrap()),
                (b.as_slice(), group_optimizer(&host, &b).unwrap()),
            ];
            assert_eq!(groups[0].1.param_sizes(), &[1, 2]);
            let mut back = Optimizer::new(cfg, &sizes).unwrap();
            merge_optimizers(&mut back, &groups).unwrap();
            assert_eq!(back.step_count(), 2);
            assert_eq!(back.state_tensors(), host.state_tensors());
        }
    }
}
