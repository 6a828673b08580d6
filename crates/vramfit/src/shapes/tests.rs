//! The shape backend places outputs as CubeCL does, and refuses what it
//! cannot trace.

use burn::prelude::*;

use super::{Allocation, ShapeDevice, Shapes, record};

const F32: u64 = 4;

fn reserves(events: &[Allocation]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Allocation::Reserve { bytes } => Some(*bytes),
            _ => None,
        })
        .collect()
}

#[test]
fn outputs_are_new_buffers_in_place_writes_or_views() {
    let recording = record(512);
    let d = ShapeDevice;
    let x = Tensor::<Shapes, 2>::zeros([8, 16], &d);
    // The last handle given to an elementwise op: written in place.
    let y = x.exp();
    // A permutation and a reshape that strides can say: views.
    let t = y.clone().transpose();
    let r = y.clone().reshape([16, 8]);
    // A reshape of the transposed: a copy.
    let c = t.reshape([128]);
    // A handle still held elsewhere: a new buffer.
    let z = y.clone() + 1.0;
    drop((r, c, z, y));
    let traced = recording.finish().unwrap();
    assert_eq!(reserves(&traced.events), [8 * 16 * F32, 128 * F32, 8 * 16 * F32]);
    // Everything went: each reservation freed once.
    let frees = traced
        .events
        .iter()
        .filter(|e| matches!(e, Allocation::Free { .. }))
        .count();
    assert_eq!(frees, 3);
    assert!(traced.operations >= 6, "{}", traced.operations);
}

#[test]
fn a_shape_that_depends_on_values_is_refused_by_name() {
    let recording = record(512);
    let d = ShapeDevice;
    let mask = Tensor::<Shapes, 2>::zeros([4, 4], &d).greater_elem(0.5);
    let _where = mask.argwhere();
    let e = recording.finish().unwrap_err().to_string();
    assert!(e.contains("argwhere") && e.contains("[4, 4]"), "{e}");
}

#[test]
fn reads_give_zeros_and_are_counted() {
    let recording = record(512);
    let x = Tensor::<Shapes, 1>::ones([3], &ShapeDevice);
    assert_eq!(x.into_data().to_vec::<f32>().unwrap(), vec![0.0; 3]);
    assert_eq!(recording.finish().unwrap().reads, 1);
}
