//! Concurrency stress tests of the shared state: many threads submitting, admitting, running,
//! cancelling and failing at once, with a monitor checking capacity the whole time.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use pygpukit_sched::device::HostDevice;
use pygpukit_sched::scheduler::{Scheduler, SchedulerConfig, TaskMeta, TaskPolicy, TaskState};
use pygpukit_sched::transfer::{AsyncTransferEngine, TransferState};
use pygpukit_sched::{AdmissionConfig, AdmissionController, DeviceOps, QosClass, ResourceRequest};

const CAPACITY: u64 = 10_000;

/// A tiny deterministic generator per thread (no shared RNG state between threads).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

#[test]
fn many_threads_share_one_scheduler_without_losing_or_repeating_tasks() {
    const SUBMITTERS: u64 = 6;
    const PER_THREAD: u64 = 2_000;
    let mut cfg = SchedulerConfig::new(CAPACITY);
    cfg.policy = TaskPolicy::Priority;
    cfg.admission.max_pending_tasks = 1_000_000;
    let s = Arc::new(Scheduler::new(cfg).unwrap());
    let started = Arc::new(Mutex::new(HashSet::new()));
    let done = Arc::new(AtomicBool::new(false));
    let submitted = Arc::new(AtomicU64::new(0));

    let mut handles = Vec::new();
    for t in 0..SUBMITTERS {
        let (s, submitted) = (s.clone(), submitted.clone());
        handles.push(thread::spawn(move || {
            let mut rng = Lcg(t + 1);
            for i in 0..PER_THREAD {
                let mut meta = TaskMeta::new(format!("t{t}-{i}"), "")
                    .memory(rng.next() % 1_500)
                    .priority((rng.next() % 7) as i32 - 3)
                    .qos(QosClass::ALL[(rng.next() % 3) as usize]);
                if i > 0 && rng.next() % 4 == 0 {
                    meta = meta.depends_on([format!("t{t}-{}", i - 1 - rng.next() % i.min(5))]);
                }
                match s.submit(meta) {
                    Ok(()) => {
                        submitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("submit failed: {e}"),
                }
                if rng.next() % 50 == 0 {
                    // Cancel something of this thread's, whatever state it is in.
                    let _ = s.cancel(&format!("t{t}-{}", rng.next() % (i + 1)));
                }
            }
        }));
    }
    let mut workers = Vec::new();
    for w in 0..3u64 {
        let (s, started, done) = (s.clone(), started.clone(), done.clone());
        workers.push(thread::spawn(move || {
            let mut rng = Lcg(100 + w);
            let mut idle_rounds = 0;
            loop {
                s.admit(64);
                let mut progressed = false;
                while let Some(id) = s.next_runnable() {
                    progressed = true;
                    assert!(
                        started.lock().unwrap().insert(id.clone()),
                        "{id} handed out twice"
                    );
                    let r = if rng.next() % 20 == 0 {
                        s.fail(&id, "injected")
                    } else {
                        s.complete(&id)
                    };
                    // A running best-effort task may have been preempted (cancelled) meanwhile.
                    if let Err(e) = r {
                        assert_eq!(s.state(&id).unwrap(), TaskState::Cancelled, "{e}");
                    }
                }
                if progressed {
                    idle_rounds = 0;
                } else if done.load(Ordering::Acquire) {
                    idle_rounds += 1;
                    if idle_rounds > 50 {
                        break;
                    }
                }
                thread::yield_now();
            }
        }));
    }
    let monitor = {
        let (s, done) = (s.clone(), done.clone());
        thread::spawn(move || {
            let mut checks = 0u64;
            while !done.load(Ordering::Acquire) {
                let st = s.stats().admission;
                assert!(
                    st.memory_used <= CAPACITY,
                    "{} > {CAPACITY}",
                    st.memory_used
                );
                assert!(st.memory_by_class[1] <= CAPACITY - st.guaranteed_memory);
                checks += 1;
            }
            checks
        })
    };
    for h in handles {
        h.join().unwrap();
    }
    done.store(true, Ordering::Release);
    for w in workers {
        w.join().unwrap();
    }
    assert!(monitor.join().unwrap() > 0);

    let total = submitted.load(Ordering::Relaxed);
    assert_eq!(total, SUBMITTERS * PER_THREAD);
    let st = s.stats();
    assert_eq!(st.by_state.iter().sum::<i64>(), total as i64);
    for state in [TaskState::Pending, TaskState::Admitted, TaskState::Running] {
        assert_eq!(
            s.tasks_in(state),
            Vec::<String>::new(),
            "tasks left {state}"
        );
    }
    assert_eq!(st.admission.memory_used, 0);
    assert_eq!(st.admission.pending, 0);
    let ran = started.lock().unwrap().len() as i64;
    assert_eq!(
        ran,
        st.by_state[TaskState::Completed as usize]
            + st.by_state[TaskState::Failed as usize]
            + s.tasks_in(TaskState::Cancelled)
                .iter()
                .filter(|id| s.task(id).unwrap().started_ns > 0)
                .count() as i64
    );
}

#[test]
fn concurrent_admissions_never_exceed_capacity() {
    let c = Arc::new(AdmissionController::new(AdmissionConfig::new(CAPACITY)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (c, stop) = (c.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let st = c.stats();
                assert!(st.memory_used <= CAPACITY);
                assert!(st.bandwidth_used <= 1.0 + 1e-9);
            }
        })
    };
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let c = c.clone();
            thread::spawn(move || {
                let mut rng = Lcg(t + 7);
                let mut mine = Vec::new();
                for i in 0..20_000u64 {
                    let class = QosClass::ALL[(rng.next() % 3) as usize];
                    let req = ResourceRequest::new(
                        class,
                        rng.next() % 3_000,
                        (rng.next() % 20) as f64 / 100.0,
                    );
                    let id = format!("{t}-{i}");
                    if c.try_admit(&id, &req).unwrap().is_admitted() {
                        mine.push(id);
                    }
                    if mine.len() > 4 || rng.next() % 3 == 0 {
                        if let Some(id) = mine.pop() {
                            let _ = c.release(&id); // may have been preempted already
                        }
                    }
                }
                for id in mine {
                    let _ = c.release(&id);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Release);
    monitor.join().unwrap();
    let st = c.stats();
    assert_eq!((st.memory_used, st.active), (0, 0));
    assert!(st.bandwidth_used.abs() < 1e-9);
    assert!(st.preempted > 0, "the mix should have exercised preemption");
}

#[test]
fn many_threads_share_one_transfer_engine() {
    let dev = Arc::new(HostDevice::new());
    let engine = Arc::new(AsyncTransferEngine::new(dev.clone(), 3).unwrap());
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let (dev, engine) = (dev.clone(), engine.clone());
            thread::spawn(move || {
                let a = dev.allocate(4096, 0).unwrap();
                for round in 0..50u8 {
                    let data = vec![t ^ round; 4096];
                    let up = engine
                        .enqueue_h2d(a, Box::new(data), i32::from(round % 3))
                        .unwrap();
                    assert_eq!(engine.wait(up).unwrap(), TransferState::Completed);
                    let down = engine.enqueue_d2h(Box::new(vec![0u8; 4096]), a, 0).unwrap();
                    assert_eq!(engine.wait(down).unwrap(), TransferState::Completed);
                    let buf = engine.take_buffer(down).unwrap();
                    // SAFETY: a Vec<u8> of buf.len() bytes owned by `buf`.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(buf.addr() as *const u8, buf.len()) };
                    assert!(bytes.iter().all(|b| *b == t ^ round));
                }
                dev.free(a).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    engine.synchronize().unwrap();
    let st = engine.lane_stats(pygpukit_sched::CopyKind::HostToDevice);
    assert_eq!((st.completed, st.failed, st.in_flight), (300, 0, 0));
}
