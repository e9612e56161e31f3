//! O1's conv and linear layers, run as f32 kernels on values cast to f16
//! and back, against the f16 ops they stand for (operands cast to f16, the
//! f16 kernel, outputs cast back to f32): bit for bit, forward and backward,
//! with values that f16 rounds, and gradients that overflow it.

use super::*;
use crate::ops::testing::rand_vec_f32;

fn seed_model() -> Model {
    let path = crate::testing::repo_root().join("configs/mnist_o0.toml");
    let resolved = crate::config::model::resolve(&crate::config::load(&path, &[]).unwrap().model).unwrap();
    Model::new(&resolved, 1).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    assert_eq!(t.dtype(), DType::F32);
    t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Values f16 rounds (1/3 steps), some past its range once summed.
fn input(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let v = rand_vec_f32(shape.iter().product(), seed).iter().map(|x| x * scale / 3.0).collect();
    Tensor::from_vec(shape, v).unwrap()
}

fn f16_op_reference(layer: &Node, x: &Tensor, dy: &Tensor) -> (Tensor, Tensor, Tensor, Option<Tensor>) {
    let h = |t: &Tensor| t.to_dtype(DType::F16);
    let (weight, bias) = (&layer.weights.params[0], layer.weights.params.get(1));
    match &layer.kind {
        LayerKind::Conv2d(conv) => {
            let args = &conv.args();
            let (w, b) = (h(&weight.value), bias.as_ref().map(|b| h(&b.value)));
            let y = ops::conv2d::forward(&h(x), &w, b.as_ref(), *args).unwrap();
            let mut dw = Tensor::zeros_dtype(w.shape(), DType::F16);
            let mut db = b.as_ref().map(|b| Tensor::zeros_dtype(b.shape(), DType::F16));
            let dx = ops::conv2d::backward(&h(x), &w, &h(dy), *args, &mut dw, db.as_mut(), true).unwrap();
            let f = |t: Tensor| t.into_dtype(DType::F32);
            (f(y), f(dx.unwrap()), f(dw), db.map(f))
        }
        LayerKind::Linear(_) => {
            let (w, b) = (h(&weight.value), bias.as_ref().map(|b| h(&b.value)));
            let y = ops::linear::forward(&h(x), &w, b.as_ref()).unwrap();
            let mut dw = Tensor::zeros_dtype(w.shape(), DType::F16);
            let mut db = b.as_ref().map(|b| Tensor::zeros_dtype(b.shape(), DType::F16));
            let dx = ops::linear::backward(&h(x), &w, &h(dy), &mut dw, db.as_mut(), true).unwrap();
            let f = |t: Tensor| t.into_dtype(DType::F32);
            (f(y), f(dx.unwrap()), f(dw), db.map(f))
        }
        _ => unreachable!("only conv and linear layers run patched"),
    }
}

#[test]
fn o1_conv_and_linear_equal_the_f16_ops_bit_for_bit() {
    let mut model = seed_model();
    let prec = Precision { input: DType::F32, patch_conv_linear: Some(DType::F16) };
    // (layer index, input shape, output shape) in the seed ConvNet, batch 5.
    let cases = [(0, [5, 1, 28, 28], vec![5, 16, 28, 28]), (4, [5, 16, 14, 14], vec![5, 32, 14, 14])];
    let linear = (9, [5, 1568], vec![5, 10]);
    for (i, (at, xs, ys)) in cases
        .iter()
        .map(|(a, x, y)| (*a, x.to_vec(), y.clone()))
        .chain([(linear.0, linear.1.to_vec(), linear.2.clone())])
        .enumerate()
    {
        let layer = &mut model.layers[at];
        let x = input(&xs, 10 + i as u64, 4.0);
        // Scaled like a loss-scaled gradient: some weight gradients overflow f16.
        // (The linear layer's few products overflow only past f16's range.)
        let dy = input(&ys, 20 + i as u64, if at == linear.0 { 200_000.0 } else { 30_000.0 });
        let (y0, dx0, dw0, db0) = f16_op_reference(layer, &x, &dy);
        let (y, saved) = layer.forward_train(vec![x], prec, Default::default()).unwrap();
        assert_eq!(bits(&y), bits(&y0), "layer {at}: y");
        let dx = layer.backward(saved, dy, Vec::new(), &[true], prec, None).unwrap().remove(0).unwrap();
        assert_eq!(bits(&dx), bits(&dx0), "layer {at}: dx");
        let params = &layer.weights.params;
        assert_eq!(bits(&params[0].grad), bits(&dw0), "layer {at}: weight grad");
        if let Some(db0) = db0 {
            assert_eq!(bits(&params[1].grad), bits(&db0), "layer {at}: bias grad");
        }
        assert!(params[0].grad.to_f32_vec().iter().any(|v| v.is_infinite()), "layer {at}: no overflow");
    }
}
