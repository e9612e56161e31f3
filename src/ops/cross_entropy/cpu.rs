//! Softmax cross-entropy CPU kernels over `[n, c]` logits, row by row. Each
//! row is computed in `T` with max-subtraction (so large logits cannot
//! overflow `exp`); only the batch sum of the losses is carried in f64.

use crate::ops::Elem;

/// What one row contributes: its loss and whether its argmax hit the label.
struct RowResult<T> {
    loss: T,
    hit: bool,
}

/// The row max and its first position (`torch.argmax` keeps the first of equal
/// maxima; a NaN logit wins, as it does there).
#[inline]
fn row_max<T: Elem>(row: &[T]) -> (T, usize) {
    let mut best = (T::neg_infinity(), 0);
    for (j, &v) in row.iter().enumerate() {
        if v > best.0 || (v.is_nan() && !best.0.is_nan()) {
            best = (v, j);
        }
    }
    best
}

/// `loss = logsumexp(row) - row[label]`; when `dlogits` is given it receives
/// `scale * (softmax(row) - onehot(label))`.
#[inline]
fn row<T: Elem>(row: &[T], label: usize, scale: T, dlogits: Option<&mut [T]>) -> RowResult<T> {
    let (max, arg) = row_max(row);
    // Subtracting the max keeps every exp() in (0, 1]. A row holding NaN or
    // infinities ends up with a non-finite loss, as in PyTorch, which the
    // trainer reports.
    let shift = max;
    let mut sum = T::zero();
    match dlogits {
        Some(d) => {
            for (o, &v) in d.iter_mut().zip(row) {
                let e = (v - shift).exp();
                *o = e;
                sum = sum + e;
            }
            let k = scale / sum;
            for o in d.iter_mut() {
                *o = *o * k;
            }
            d[label] = d[label] - scale;
        }
        None => {
            for &v in row {
                sum = sum + (v - shift).exp();
            }
        }
    }
    // `shift - row[label]` is exact for nearby values; adding it last keeps
    // large logits (hundreds) from costing the loss its low digits.
    RowResult { loss: sum.ln() + (shift - row[label]), hit: arg == label }
}

/// Sum of the per-row losses (f64) and the number of rows whose argmax equals
/// the label. Labels must already be checked `< c`.
pub fn forward<T: Elem>(logits: &[T], labels: &[u32], c: usize) -> (f64, usize) {
    let mut total = 0.0f64;
    let mut correct = 0;
    for (r, &l) in logits.chunks_exact(c).zip(labels) {
        let res = row(r, l as usize, T::zero(), None);
        total += Elem::to_f64(res.loss);
        correct += usize::from(res.hit);
    }
    (total, correct)
}

/// Like [`forward`], and fills `dlogits` with `grad_scale * d(mean loss)/dlogits`
/// = `grad_scale * (softmax - onehot) / n`.
pub fn forward_backward<T: Elem>(
    logits: &[T],
    labels: &[u32],
    c: usize,
    grad_scale: T,
    dlogits: &mut [T],
) -> (f64, usize) {
    debug_assert_eq!(logits.len(), dlogits.len());
    let n = labels.len();
    let scale = grad_scale / T::from_usize(n).unwrap_or_else(T::nan);
    let mut total = 0.0f64;
    let mut correct = 0;
    for ((r, d), &l) in logits.chunks_exact(c).zip(dlogits.chunks_exact_mut(c)).zip(labels) {
        let res = row(r, l as usize, scale, Some(d));
        total += Elem::to_f64(res.loss);
        correct += usize::from(res.hit);
    }
    (total, correct)
}
