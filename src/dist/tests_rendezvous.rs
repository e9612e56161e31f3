use super::rendezvous::{join, read_hello, serve, Membership, RendezvousOpts};
use super::wire;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn opts(fp: &str, token: Option<&str>, timeout_ms: u64) -> RendezvousOpts {
    RendezvousOpts {
        fingerprint: fp.into(),
        config: serde_json::Value::Null,
        job_token: token.map(Into::into),
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// Rank 0 serving on a fresh loopback port, and that port's endpoint.
fn start_master(world: usize, o: RendezvousOpts) -> (JoinHandle<crate::Result<Membership>>, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    (std::thread::spawn(move || serve(l, world, &o)), ep)
}

fn start_rank(
    ep: &str,
    rank: usize,
    world: usize,
    o: RendezvousOpts,
) -> JoinHandle<crate::Result<Membership>> {
    let ep = ep.to_string();
    std::thread::spawn(move || join(&ep, rank, world, &o))
}

#[test]
fn two_and_three_ranks_get_the_same_address_table() {
    for world in [2, 3] {
        let (m0, ep) = start_master(world, opts("fp", None, 5000));
        let others: Vec<_> = (1..world).map(|r| start_rank(&ep, r, world, opts("fp", None, 5000))).collect();
        let m0 = m0.join().unwrap().unwrap();
        let ms: Vec<Membership> = others.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        assert_eq!(m0.peers.len(), world);
        for (r, m) in ms.iter().enumerate() {
            assert_eq!((m.rank, m.world_size, m.session), (r + 1, world, m0.session));
            assert_eq!(m.peers, m0.peers, "loopback: every rank sees the same table");
            assert_eq!(m.listener.local_addr().unwrap(), m.peers[r + 1]);
        }
        assert_eq!(m0.listener.local_addr().unwrap(), m0.peers[0]);
    }
}

#[test]
fn config_mismatch_is_refused_on_both_sides_naming_both() {
    let (m0, ep) = start_master(2, opts("aaaa", None, 5000));
    let r1 = start_rank(&ep, 1, 2, opts("bbbb", None, 5000)).join().unwrap().unwrap_err().to_string();
    let r0 = m0.join().unwrap().unwrap_err().to_string();
    for m in [&r0, &r1] {
        assert!(m.contains("config differs: rank 0 has fingerprint aaaa, rank 1"), "{m}");
        assert!(m.contains("has bbbb"), "{m}");
    }
    assert!(r1.contains("rank 0 refused rank 1"), "{r1}");
}

/// Opts of a rank running the seed config with `sets` applied.
fn config_opts(sets: &[&str]) -> RendezvousOpts {
    let path = crate::testing::repo_root().join("configs/mnist_o0.toml");
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let cfg = crate::config::load(&path, &sets).unwrap();
    RendezvousOpts::for_config(&cfg, None, Duration::from_secs(5))
}

#[test]
fn config_mismatch_names_the_keys_that_differ_with_both_values() {
    // run.out_dir is per rank and left out of the fingerprint: not named.
    let (m0, ep) = start_master(2, config_opts(&["run.out_dir=a"]));
    let theirs = config_opts(&["optimizer.lr=0.1", "train.max_steps=7", "run.out_dir=b"]);
    let r1 = start_rank(&ep, 1, 2, theirs).join().unwrap().unwrap_err().to_string();
    let r0 = m0.join().unwrap().unwrap_err().to_string();
    for m in [&r0, &r1] {
        assert!(
            m.contains(
                "the keys that differ: optimizer.lr: rank 0 0.05, rank 1 0.1; train.max_steps: rank 0 (unset), rank 1 7"
            ),
            "{m}"
        );
        assert!(!m.contains("out_dir"), "{m}");
    }
    // Without configs to compare (the self-test has only a fingerprint), the refusal says where to look.
    let (m0, ep) = start_master(2, opts("aaaa", None, 5000));
    let r1 = start_rank(&ep, 1, 2, config_opts(&[])).join().unwrap().unwrap_err().to_string();
    assert!(r1.contains("compare `ddptrain check` on both"), "{r1}");
    assert!(m0.join().is_ok());
}

#[test]
fn world_size_mismatch_is_refused_on_both_sides_naming_both() {
    let (m0, ep) = start_master(2, opts("fp", None, 5000));
    let r1 = start_rank(&ep, 1, 3, opts("fp", None, 5000)).join().unwrap().unwrap_err().to_string();
    let r0 = m0.join().unwrap().unwrap_err().to_string();
    for m in [&r0, &r1] {
        assert!(m.contains("rank 0 has WORLD_SIZE=2, rank 1") && m.contains("has WORLD_SIZE=3"), "{m}");
    }
}

#[test]
fn a_failed_rendezvous_releases_ranks_that_already_joined() {
    let (m0, ep) = start_master(3, opts("fp", None, 5000));
    let good = start_rank(&ep, 1, 3, opts("fp", None, 5000));
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let bad = start_rank(&ep, 2, 3, opts("other", None, 5000)).join().unwrap();
    assert!(bad.is_err());
    let m = good.join().unwrap().unwrap_err().to_string();
    assert!(m.contains("rank 0 aborted the rendezvous") && m.contains("config differs"), "{m}");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(m0.join().unwrap().is_err());
}

#[test]
fn duplicate_rank_is_an_error() {
    let (m0, ep) = start_master(3, opts("fp", None, 5000));
    let a = start_rank(&ep, 1, 3, opts("fp", None, 5000));
    std::thread::sleep(Duration::from_millis(200));
    let b = start_rank(&ep, 1, 3, opts("fp", None, 5000));
    let r0 = m0.join().unwrap().unwrap_err().to_string();
    assert!(r0.contains("rank 1 joined twice: from 127.0.0.1:"), "{r0}");
    assert!(a.join().unwrap().is_err() && b.join().unwrap().is_err());
}

#[test]
fn job_token_is_required_when_rank_zero_has_one() {
    let (m0, ep) = start_master(2, opts("fp", Some("s3cret"), 5000));
    let none = start_rank(&ep, 1, 2, opts("fp", None, 5000)).join().unwrap().unwrap_err().to_string();
    assert!(none.contains("it presented no job token; set the same DDPTRAIN_JOB_TOKEN"), "{none}");
    let wrong =
        start_rank(&ep, 1, 2, opts("fp", Some("guess"), 5000)).join().unwrap().unwrap_err().to_string();
    assert!(wrong.contains("it presented a wrong job token"), "{wrong}");
    // Strangers do not end the job: the real rank still gets in.
    let ok = start_rank(&ep, 1, 2, opts("fp", Some("s3cret"), 5000)).join().unwrap().unwrap();
    assert_eq!(ok.session, m0.join().unwrap().unwrap().session);
}

#[test]
fn garbage_on_the_port_is_ignored_and_never_allocated() {
    let (m0, ep) = start_master(2, opts("fp", None, 5000));
    // A length prefix of 4 GiB, an HTTP request (its first bytes read as ~1.2 GB), a
    // valid-size frame with the wrong magic, and one that connects and hangs up.
    let junk: [&[u8]; 4] =
        [&[0xff, 0xff, 0xff, 0xff, 1, 2, 3], b"GET / HTTP/1.1\r\n\r\n", b"\0\0\0\x08NOPE1234", b""];
    for j in junk {
        let mut s = TcpStream::connect(&ep).unwrap();
        s.write_all(j).unwrap();
    }
    let m1 = start_rank(&ep, 1, 2, opts("fp", None, 5000)).join().unwrap().unwrap();
    assert_eq!(m1.session, m0.join().unwrap().unwrap().session);
}

#[test]
fn bad_handshakes_say_what_is_wrong() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap();
    let cases: [(&[u8], &str); 3] = [
        (&[0xff, 0xff, 0xff, 0xff], "message claims 4294967295 bytes, more than the 1048576 allowed"),
        (b"\0\0\0\x08NOPE1234", "bad magic: not a ddptrain rank"),
        (b"\0\0\0\x0aDDPT\0\0\0\x02\0\0", "message truncated"),
    ];
    for (bytes, want) in cases {
        let mut c = TcpStream::connect(ep).unwrap();
        c.write_all(bytes).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let e = read_hello(&mut s).err().expect("garbage must not parse");
        assert!(e.to_string().contains(want), "{e}");
    }
    let mut c = TcpStream::connect(ep).unwrap();
    let (mut s, _) = l.accept().unwrap();
    wire::write_frame(&mut c, &[0u8; 16]).unwrap();
    assert!(read_hello(&mut s).is_err());
}

#[test]
fn waiting_is_bounded_by_the_timeout() {
    let t = Instant::now();
    let (m0, _ep) = start_master(3, opts("fp", None, 300));
    let m = m0.join().unwrap().unwrap_err().to_string();
    assert!(m.contains("ranks [1, 2] of WORLD_SIZE=3 did not join within 0.3s (parallel.timeout_s)"), "{m}");
    // Nobody listening: the joiner retries, then gives up naming the endpoint.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ep = format!("127.0.0.1:{port}");
    let m = join(&ep, 1, 2, &opts("fp", None, 300)).unwrap_err().to_string();
    assert!(m.contains(&format!("could not reach rank 0 at {ep}")), "{m}");
    // Rank 0 up but the third rank never comes: the joiner's wait ends too.
    let (m0, ep) = start_master(3, opts("fp", None, 400));
    let m = join(&ep, 1, 3, &opts("fp", None, 300)).unwrap_err().to_string();
    assert!(m.contains("did not all join within 0.3s"), "{m}");
    assert!(m0.join().unwrap().is_err());
    assert!(t.elapsed() < Duration::from_secs(5));
}
