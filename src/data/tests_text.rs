//! `dataset = "text"`: reading, vocabularies, the split, window draws and
//! every bad input's message.

use std::sync::Arc;

use super::text::{self, Vocab, VocabKind, Windows};
use super::{Dataset, Loader, Split};
use crate::error::Error;

fn windows(tokens: Vec<u32>, block_size: usize, count: usize, split: Split) -> Windows {
    Windows { tokens: Arc::new(tokens), vocab: Arc::new(Vocab::Bytes), block_size, count, seed: 5, split }
}

fn data_msg(e: Error) -> (std::path::PathBuf, String) {
    match e {
        Error::Data { path, msg } => (path, msg),
        other => panic!("expected a data error, got {other}"),
    }
}

#[test]
fn bytes_split_as_nanogpt_prepare() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.txt");
    let text = "hello world, this is a small text file.\n".repeat(5);
    std::fs::write(&path, &text).unwrap();
    let c = text::load(&path, VocabKind::Bytes, 0.1, 8).unwrap();
    let n = text.len();
    // prepare.py: data[:int(n*0.9)], data[int(n*0.9):].
    let cut = (n as f64 * 0.9) as usize;
    assert_eq!(c.train.len(), cut);
    assert_eq!(c.val.len(), n - cut);
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    assert_eq!((&c.train[..], &c.val[..]), (&bytes[..cut], &bytes[cut..]));
    assert_eq!(*c.vocab, Vocab::Bytes);
    assert_eq!(c.vocab.decode(&c.train[..5]), "hello");
}

#[test]
fn chars_are_the_sorted_distinct_characters_of_the_whole_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.txt");
    // 'z' and 'é' only in the validation tail: nanoGPT's vocabulary covers the whole text.
    std::fs::write(&path, format!("{}zé", "abcab ".repeat(20))).unwrap();
    let c = text::load(&path, VocabKind::Chars, 0.1, 4).unwrap();
    assert_eq!(*c.vocab, Vocab::Chars { itos: vec![' ', 'a', 'b', 'c', 'z', 'é'] });
    assert_eq!(c.vocab.encode("cab z").unwrap(), vec![3, 1, 2, 0, 4]);
    assert_eq!(c.vocab.encode("q"), Err('q'));
    // Past ASCII: found by search, or refused.
    assert_eq!(c.vocab.encode("éza"), Ok(vec![5, 4, 1]));
    assert_eq!(c.vocab.encode("aü"), Err('ü'));
    assert_eq!(c.vocab.decode(&c.val[c.val.len() - 2..]), "zé");
    let json = c.vocab.to_json().unwrap();
    let back: Vocab = serde_json::from_slice(&json).unwrap();
    assert_eq!(back, *c.vocab);
}

#[test]
fn a_directory_is_its_txt_files_in_sorted_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.txt"), "BBBBBBBBBB").unwrap();
    std::fs::write(dir.path().join("a.txt"), "AAAAAAAAAA").unwrap();
    std::fs::write(dir.path().join("notes.md"), "ignored").unwrap();
    std::fs::create_dir(dir.path().join("c")).unwrap();
    std::fs::write(dir.path().join("c/d.txt"), "CCCCCCCCCC").unwrap();
    let c = text::load(dir.path(), VocabKind::Bytes, 0.5, 4).unwrap();
    let all: Vec<u32> = c.train.iter().chain(c.val.iter()).copied().collect();
    assert_eq!(Vocab::Bytes.decode(&all), "AAAAAAAAAABBBBBBBBBBCCCCCCCCCC");
}

#[test]
fn bad_text_is_a_data_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let (path, msg) = data_msg(text::load(&empty, VocabKind::Bytes, 0.1, 4).unwrap_err());
    assert_eq!(path, empty);
    assert!(msg.contains("is empty"), "{msg}");

    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait, caf\xe9 noir, caf\xe9 cr\xe8me").unwrap();
    let (path, msg) = data_msg(text::load(&latin1, VocabKind::Chars, 0.1, 4).unwrap_err());
    assert_eq!(path, latin1);
    assert!(msg.contains("not valid UTF-8 (at byte 3)") && msg.contains("data.vocab = \"bytes\""), "{msg}");
    // Bytes take any encoding.
    assert!(text::load(&latin1, VocabKind::Bytes, 0.1, 2).is_ok());

    let short = dir.path().join("short.txt");
    std::fs::write(&short, "0123456789").unwrap();
    let (path, msg) = data_msg(text::load(&short, VocabKind::Bytes, 0.1, 4).unwrap_err());
    assert_eq!(path, short);
    assert!(
        msg.contains("the validation split holds 1 tokens of 10")
            && msg.contains("fewer than one window of block_size + 1 = 5"),
        "{msg}"
    );
    let (_, msg) = data_msg(text::load(&short, VocabKind::Bytes, 0.9, 4).unwrap_err());
    assert!(msg.contains("the training split holds 0 tokens of 10"), "{msg}");

    let none = tempfile::tempdir().unwrap();
    std::fs::write(none.path().join("x.md"), "no text here").unwrap();
    let (path, msg) = data_msg(text::load(none.path(), VocabKind::Bytes, 0.1, 4).unwrap_err());
    assert_eq!((path.as_path(), msg.as_str()), (none.path(), "holds no *.txt file"));

    let missing = dir.path().join("missing.txt");
    let (path, msg) = data_msg(text::load(&missing, VocabKind::Bytes, 0.1, 4).unwrap_err());
    assert_eq!(path, missing);
    assert!(msg.contains("cannot read it") && msg.contains("scripts/fetch-sotu.sh"), "{msg}");
}

#[test]
fn window_offsets_depend_on_seed_split_epoch_and_index_only() {
    let tokens: Vec<u32> = (0..1000).collect();
    let w = windows(tokens.clone(), 16, 50, Split::Train);
    let offsets = |w: &Windows, e: u64| (0..50).map(|i| w.offset(e, i)).collect::<Vec<_>>();
    let e0 = offsets(&w, 0);
    assert_eq!(e0, offsets(&w.clone(), 0), "a window is a pure function of its key");
    assert!(e0.iter().all(|&o| o + 16 < 1000), "every window fits: {e0:?}");
    assert_ne!(e0, offsets(&w, 1), "epochs draw afresh");
    let val = windows(tokens.clone(), 16, 50, Split::Test);
    assert_ne!(e0, offsets(&val, 0), "the splits draw apart");
    let reseeded = Windows { seed: 6, ..w.clone() };
    assert_ne!(e0, offsets(&reseeded, 0));
    // Windows reach the last start and spread over the stream.
    let many: Vec<usize> = (0..5000).map(|i| w.offset(0, i)).collect();
    assert_eq!(many.iter().max(), Some(&(1000 - 16 - 1)));
    assert_eq!(many.iter().min(), Some(&0));
}

#[test]
fn a_text_batch_is_inputs_and_next_token_targets() {
    let tokens: Vec<u32> = (0..300).map(|i| i % 251).collect();
    let w = windows(tokens.clone(), 8, 40, Split::Train);
    let ds = Arc::new(Dataset {
        images: Vec::new(),
        labels: Vec::new(),
        sample_shape: vec![8],
        num_classes: 256,
        text: Some(w.clone()),
    });
    assert_eq!(ds.len(), 40);
    let order: Vec<usize> = (0..40).rev().collect();
    let loader = Loader::training(Arc::clone(&ds), order.clone(), (6, false, 2), 3, None);
    let mut seen = 0;
    for (k, b) in loader.enumerate() {
        let rows = order[k * 6..(k * 6 + 6).min(40)].to_vec();
        assert_eq!(b.images.shape(), &[rows.len(), 8]);
        assert_eq!(b.labels.len(), rows.len() * 8);
        let x = b.images.as_f32().unwrap();
        for (r, &i) in rows.iter().enumerate() {
            let at = w.offset(3, i);
            let want: Vec<f32> = tokens[at..at + 8].iter().map(|&t| t as f32).collect();
            assert_eq!(&x[r * 8..r * 8 + 8], &want[..]);
            assert_eq!(&b.labels[r * 8..r * 8 + 8], &tokens[at + 1..at + 9]);
        }
        seen += rows.len();
    }
    assert_eq!(seen, 40);
}
