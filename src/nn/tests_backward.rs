//! Backward with the parameter gradients deferred to the pool (backward.rs)
//! against backward on one thread, which runs them in place: the same bits
//! in every `.grad`, and the hooks called in the same order with them.

use super::backward::SPAWNED;
use super::Model;
use crate::amp::{cast_model, Policy};
use crate::config::tests_load::load_text;
use crate::config::{model, OptLevel, ResolvedLayer};
use crate::tensor::Tensor;

/// tests/common/gpt.toml: 2 layers, 2 heads, width 32 over 16 positions of
/// bytes, its linears and layernorms with biases when `bias`.
fn gpt(bias: bool) -> Vec<ResolvedLayer> {
    let fill = [("{VOCAB}", "bytes"), ("{C3}", "96"), ("{C4}", "128"), ("{C}", "32"), ("{T}", "16")];
    let fill = fill.into_iter().chain([("{H}", "2"), ("{L}", "2"), ("{V}", "256"), ("{P}", "0.0")]);
    let mut text =
        fill.fold(include_str!("../../tests/common/gpt.toml").to_owned(), |t, (k, v)| t.replace(k, v));
    if bias {
        text = text.replace("bias = false", "bias = true");
    }
    let (cfg, _) = load_text(&text, &[], &[]);
    model::resolve(&cfg.unwrap().model).unwrap()
}

fn values(n: usize, seed: u32, modulus: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % modulus).map(|v| v as f32).collect()
}

/// Every parameter's gradient after one forward and backward on `threads`
/// threads, the hooks' (index, gradient) calls, and how many tasks the walk spawned.
type Run = (Vec<Vec<f32>>, Vec<(usize, Vec<f32>)>, usize);

fn run(threads: usize, layers: &[ResolvedLayer], level: OptLevel) -> Run {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let mut m = Model::new(layers, 5).unwrap();
        cast_model(&mut m, &Policy::for_level(level));
        let x = Tensor::from_vec(&[4, 16], values(64, 3, 64)).unwrap();
        let (y, saved) = m.forward_train(x).unwrap();
        let dy: Vec<f32> = values(y.numel(), 7, 1000).iter().map(|v| v / 500.0 - 1.0).collect();
        let dy = Tensor::from_vec(y.shape(), dy).unwrap().into_dtype(y.dtype());
        let before = SPAWNED.with(|n| n.get());
        let mut ready = Vec::new();
        m.backward_hooked(saved, dy, &mut |i, g| {
            ready.push((i, g.to_f32_vec()));
            Ok(())
        })
        .unwrap();
        let spawned = SPAWNED.with(|n| n.get()) - before;
        (m.params().iter().map(|p| p.grad.to_f32_vec()).collect(), ready, spawned)
    })
}

#[test]
fn deferred_parameter_gradients_are_the_in_place_ones() {
    for bias in [false, true] {
        let layers = gpt(bias);
        for level in [OptLevel::O0, OptLevel::O1, OptLevel::O2] {
            let (grads, ready, none) = run(1, &layers, level);
            assert_eq!(none, 0, "one thread defers nothing");
            // lm_head's weight is wte's: 15 parameters; biases add the
            // layernorms' 5 and the linears' 9.
            assert_eq!(grads.len(), if bias { 29 } else { 15 });
            assert!(grads.iter().all(|g| g.iter().any(|v| *v != 0.0)), "bias={bias} {level:?}");
            let order: Vec<usize> = ready.iter().map(|(i, _)| *i).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..grads.len()).collect::<Vec<_>>(), "each parameter reported once");
            for threads in [2, 3] {
                let (g, r, spawned) = run(threads, &layers, level);
                // The 9 linears (lm_head included) defer, except under O1,
                // whose patched call adds its gradients into the f32 ones.
                assert_eq!(spawned, if level == OptLevel::O1 { 0 } else { 9 }, "{threads} threads {level:?}");
                assert!(g == grads, "bias={bias} {level:?} {threads} threads: gradients differ");
                assert!(r == ready, "bias={bias} {level:?} {threads} threads: hooks differ");
            }
        }
    }
}
