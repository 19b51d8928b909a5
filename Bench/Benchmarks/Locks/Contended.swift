// Contended throughput and fairness: N threads, one lock, one shared counter.
//
// One measured iteration is one *window* of `ContendedWorkload.window`:
//
// 1. The benchmark's thread releases N persistent worker threads (created
//    once per benchmark, before the first iteration, and parked on a
//    pthread barrier between windows: creating threads costs microseconds
//    and must stay out of the measurement).
// 2. Each worker checks in and yields the CPU until a "go" flag is raised.
//    The benchmark's thread raises it, and starts the clock, once every
//    worker has checked in. Without this, 16 threads woken at once on 2
//    cores reach the CPU up to tens of milliseconds apart (measured here
//    under load), and the late ones would lose their share to the scheduler,
//    not to the lock.
// 3. Every worker loops: take the lock, increment the shared counter, release
//    it, count one operation, until a stop flag is raised. The flag is read
//    with a relaxed load before each acquisition; it sits alone on its cache
//    line and nobody writes it during the window, so reading it costs an L1 hit.
// 4. The benchmark's thread sleeps through the window (it does not compete
//    for the two cores), raises the flag, and waits on the barrier for every
//    worker to finish its operation in progress.
//
// The row's time is the window's elapsed time ("go" to the last worker's
// return, measured on the benchmark's thread) over the operations all workers
// completed: BenchSupport's `timePerOperation`, so a ratio below 1 means more
// operations per second than the reference. A fixed time rather than a fixed
// number of operations is what makes fairness measurable: with a fixed count
// per thread every thread would do the same number of operations by
// construction. fairness = fewest / most operations of one thread in the
// window (BenchSupport's `fairness`); longest wait = the most acquisitions by
// other threads between two of one thread's, times the window's time per
// operation (BenchSupport's `longestWait`): counted from the shared counter,
// which each worker reads inside the lock, so that no clock read slows the
// workers.
//
// Placement: the counter, the three flags (check-in, go, stop), each
// worker's result and every pthread or Synchronization lock sit on cache
// lines of their own. Spindle's
// Lock, NSLock and NIOLock allocate their lock word themselves (in small heap
// objects); nothing hot is allocated near them.
//
// After each window the counter must equal the sum of the workers' counts:
// a lock that let two threads in at once would lose increments, and the
// benchmark stops with a message rather than report a number.

import Benchmark
import BenchSupport
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What one contended group does.
struct ContendedWorkload {
    /// Worker threads hammering the lock (the benchmark's own thread only
    /// releases them and sleeps).
    var threads: Int
    /// How long each measured iteration runs. Long enough to span many
    /// scheduler time slices, so that a thread's share is not decided by
    /// which thread the scheduler happened to run first; short enough that a
    /// group of rows stays within seconds.
    var window: Duration = .milliseconds(40)
    /// Dependent multiply-adds on a local value done inside the lock after
    /// the increment (0: the critical section is the increment alone).
    var workInside: Int = 0
    /// The same, after releasing the lock and before taking it again.
    var workOutside: Int = 0
    /// Inside the lock, also add one to a random entry of a shared
    /// `[Int: Int]` of `dictionaryKeys` entries (0: no dictionary): a shared
    /// structure whose cache lines move with the lock.
    var dictionaryKeys: Int = 0

    /// The group's name: "lock.contended 4 threads", plus the work when any.
    var group: String {
        var name = "lock.contended \(threads) threads"
        if dictionaryKeys > 0 { name += " dictionary \(dictionaryKeys) keys" }
        if workInside > 0 || workOutside > 0 {
            name += " work \(workInside) in \(workOutside) out"
        }
        return name
    }

    /// How every implementation of a contended group runs: one window per
    /// measured iteration; a warm-up window; at most 8 windows, fewer when
    /// an implementation is so slow that 0.4 s pass first.
    static var settings: RunSettings {
        RunSettings(
            scalingFactor: .one,
            maxDuration: .milliseconds(400),
            maxIterations: 8,
            warmupIterations: 1,
            reportedMetrics: [.timePerOperation, .fairness, .longestWait]
        )
    }
}

/// Work that the optimizer cannot remove or batch: a chain of dependent
/// rounds on `seed`, returned so that the caller keeps it. A round is a
/// shift, an exclusive-or and a multiply in series, ~1.6 ns on this EPYC
/// (measured: 200 rounds take 311 ns). The shift makes each round
/// non-linear, so the chain cannot be folded: a chain of multiply-adds,
/// used here before, is an affine map that the optimizer composed several
/// rounds at a time (200 rounds ran in 31 ns, not the 320 ns intended).
@inline(never)
func spinWork(_ rounds: Int, _ seed: UInt64) -> UInt64 {
    var x = seed
    for _ in 0..<rounds {
        x = (x ^ (x >> 29)) &* 6_364_136_223_846_793_005
    }
    return x
}

/// Threads that live as long as the process, parked on a barrier between
/// jobs. `run` hands every thread the same job (with its index), runs
/// `during` on the calling thread meanwhile, and returns when all workers
/// have finished the job.
final class WorkerPool: @unchecked Sendable {
    // @unchecked: `job` is written by the benchmark's thread only between
    // jobs and read by the workers only during one; the barriers order both.

    let threads: Int
    private let start: UnsafeMutablePointer<pthread_barrier_t>
    private let finish: UnsafeMutablePointer<pthread_barrier_t>
    private var job: ((Int) -> Void)?

    init(threads: Int) {
        precondition(threads > 0)
        self.threads = threads
        start = allocateOnOwnCacheLine(pthread_barrier_t())
        finish = allocateOnOwnCacheLine(pthread_barrier_t())
        // The workers and the benchmark's thread meet at both barriers.
        precondition(pthread_barrier_init(start, nil, UInt32(threads + 1)) == 0, "pthread_barrier_init failed")
        precondition(pthread_barrier_init(finish, nil, UInt32(threads + 1)) == 0, "pthread_barrier_init failed")
        for index in 0..<threads {
            let context = Unmanaged.passRetained(WorkerContext(pool: self, index: index)).toOpaque()
            var attributes = pthread_attr_t()
            pthread_attr_init(&attributes)
            pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
            var thread = pthread_t()
            let result = pthread_create(&thread, &attributes, { context in
                let worker = Unmanaged<WorkerContext>.fromOpaque(context!).takeRetainedValue()
                worker.pool.serve(worker.index)
            }, context)
            precondition(result == 0, "pthread_create failed: \(result)")
            pthread_attr_destroy(&attributes)
        }
    }

    /// Runs `job(index)` once on each worker and `during()` on the calling
    /// thread once the workers are released; returns when `during` and every
    /// worker have returned.
    func run(_ job: @escaping (Int) -> Void, during: () -> Void) {
        self.job = job
        pthread_barrier_wait(start)
        during()
        pthread_barrier_wait(finish)
        self.job = nil
    }

    /// A worker's life: wait for a job, do it, report done, forever (the
    /// process ends when the benchmark does).
    private func serve(_ index: Int) -> Never {
        while true {
            pthread_barrier_wait(start)
            job!(index)
            pthread_barrier_wait(finish)
        }
    }
}

private final class WorkerContext {
    let pool: WorkerPool
    let index: Int
    init(pool: WorkerPool, index: Int) {
        self.pool = pool
        self.index = index
    }
}

/// The measured iteration of one implementation of a contended group.
///
/// Returns the benchmark body; its state (pool, counter, flag, results) is
/// made when it is registered, its threads on its first run.
func contendedBody<L: ContendedLock>(_ lock: L, _ workload: ContendedWorkload) -> (Benchmark) -> Void {
    let threads = workload.threads
    let window = workload.window
    let workInside = workload.workInside
    let workOutside = workload.workOutside
    let keys = workload.dictionaryKeys
    let counter = allocateOnOwnCacheLine(0)
    // The shared structure (dictionary rows), guarded by the lock.
    let table = SharedTable(keys: keys)
    let checkedIn = allocateOnOwnCacheLine(Atomic<Int>(0))
    let go = allocateOnOwnCacheLine(Atomic<Bool>(false))
    let stop = allocateOnOwnCacheLine(Atomic<Bool>(false))
    // One line per worker for its count, its most bypasses (see
    // `ReportedMetric.longestWait`) and its work's result (kept so the work
    // is not optimized away).
    let results = (0..<threads).map { _ in
        allocateOnOwnCacheLine((operations: 0, bypasses: 0, sink: UInt64(0)))
    }
    var pool: WorkerPool?

    return { benchmark in
        let workers: WorkerPool
        if let pool {
            workers = pool
        } else {
            workers = WorkerPool(threads: threads)
            pool = workers
        }
        counter.pointee = 0
        checkedIn.pointee.store(0, ordering: .relaxed)
        go.pointee.store(false, ordering: .relaxed)
        stop.pointee.store(false, ordering: .relaxed)

        let clock = ContinuousClock()
        var begin = clock.now
        workers.run({ index in
            // Yield, not sleep: the wait ends as soon as the last worker has
            // been scheduled once, and a yielding thread leaves the CPU to it.
            checkedIn.pointee.add(1, ordering: .relaxed)
            while !go.pointee.load(ordering: .relaxed) { sched_yield() }
            var operations = 0
            var bypasses = 0
            // The counter's value at this thread's last acquisition (-1: at
            // "go", so the first wait counts too).
            var last = -1
            var sink = UInt64(truncatingIfNeeded: index)
            while !stop.pointee.load(ordering: .relaxed) {
                let ticket = lock.locked {
                    let ticket = counter.pointee
                    counter.pointee = ticket &+ 1
                    if keys > 0 { table.add(to: Int(truncatingIfNeeded: sink % UInt64(keys))) }
                    if workInside > 0 { sink = spinWork(workInside, sink) }
                    return ticket
                }
                bypasses = max(bypasses, ticket &- last &- 1)
                last = ticket
                operations &+= 1
                if keys > 0 { sink = sink &* 6_364_136_223_846_793_005 &+ 1 }
                if workOutside > 0 { sink = spinWork(workOutside, sink) }
            }
            results[index].pointee = (operations, bypasses, sink)
        }, during: {
            while checkedIn.pointee.load(ordering: .relaxed) < threads { sched_yield() }
            begin = clock.now
            go.pointee.store(true, ordering: .relaxed)
            // The benchmark's thread sleeps through the window, off the cores.
            sleepThread(for: window)
            stop.pointee.store(true, ordering: .relaxed)
        })
        let end = clock.now

        let counts = results.map(\.pointee.operations)
        let total = counts.reduce(0, +)
        precondition(
            total == counter.pointee,
            "lock lost increments under contention: threads counted \(total), the counter says \(counter.pointee)")
        // A window in which the scheduler ran no worker at all has no time
        // per operation and no fairness; it is left out.
        guard total > 0 else { return }
        benchmark.recordTimePerOperation(elapsed: end - begin, operations: total)
        benchmark.recordFairness(operationsPerThread: counts)
        let mostBypasses = results.map(\.pointee.bypasses).max() ?? 0
        benchmark.recordLongestWait((end - begin) * (Double(mostBypasses + 1) / Double(total)))
        for result in results { Benchmark.blackHole(result.pointee.sink) }
    }
}

/// The shared structure of the dictionary rows: a `[Int: Int]` that only
/// code holding the group's lock touches.
final class SharedTable: @unchecked Sendable {
    // @unchecked: `entries` is only touched under the lock being measured.
    private var entries: [Int: Int]

    init(keys: Int) {
        entries = Dictionary(minimumCapacity: keys)
        for key in 0..<keys { entries[key] = 0 }
    }

    /// Adds one to `key`'s entry. Call holding the lock.
    func add(to key: Int) {
        entries[key, default: 0] &+= 1
    }
}

/// Sleeps the calling thread for `duration` (nanosleep, restarted after a signal).
func sleepThread(for duration: Duration) {
    let (seconds, attoseconds) = duration.components
    var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 && errno == EINTR {
        request = remaining
    }
}
