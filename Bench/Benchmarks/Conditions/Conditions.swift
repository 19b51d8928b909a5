// Spindle's conditions beside what a user would pick instead: NSCondition and
// pthread_cond_t for Condition and ConditionVariable, DispatchSemaphore for
// Semaphore, NSConditionLock and NIO's ConditionLock for ConditionLock.
//
// Most groups are two-thread hand-offs. The benchmark thread is one side; the
// other side is a partner thread, started the first time an implementation
// runs and left asleep in its wait afterwards (it costs nothing there and dies
// with the process). One operation is one round trip: the benchmark thread
// hands the turn over and waits until it comes back.
//
// These numbers depend on the scheduler far more than nanosecond operations
// do: on a 2-core machine shared with other work, a partner that is not
// running when the turn arrives costs a wake-up and a context switch. Read the
// spread (min/max) as well as the median, and compare rows of one run only.

import Benchmark
import BenchSupport
import Dispatch
import Foundation
import NIOConcurrencyHelpers
import Spindle

#if canImport(Glibc)
import Glibc
#endif

// MARK: - Threads

/// A plain state box for the partner threads' closures. Each field is
/// guarded by the primitive under measurement.
final class Guarded<Value>: @unchecked Sendable {
    // @unchecked: every access happens under the lock (or semaphore hand-off)
    // of the implementation being measured.
    var value: Value
    init(_ value: Value) { self.value = value }
}

private final class ThreadBody {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// Starts a detached thread running `body`.
func startDetachedThread(_ body: @escaping @Sendable () -> Void) {
    var thread = pthread_t()
    let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    let rc = pthread_create(&thread, nil, { raw in
        Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
    }, box)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    pthread_detach(thread)
}

/// Runs `start` once, the first time `once` is called: partner threads start
/// when their implementation first runs, not when benchmarks are registered.
final class StartOnce {
    private var started = false
    private let start: () -> Void
    init(_ start: @escaping () -> Void) { self.start = start }
    func once() {
        if !started {
            started = true
            start()
        }
    }
}

// MARK: - One interface over every condition implementation

/// A lock with one condition on it, as the ping-pong and producer/consumer
/// bodies use it. Each implementation is a final class, so the generic
/// bodies specialize to direct calls.
protocol ConditionPair: AnyObject, Sendable {
    func lock()
    func unlock()
    func wait()
    func signal()
    func broadcast()
}

final class SpindleConditionPair: ConditionPair, @unchecked Sendable {
    let condition = Condition()
    func lock() { condition.lock() }
    func unlock() { condition.unlock() }
    func wait() { condition.wait() }
    func signal() { condition.signal() }
    func broadcast() { condition.broadcast() }
}

final class SpindleVariablePair: ConditionPair, @unchecked Sendable {
    let mutex = Spindle.Lock()
    let variable = ConditionVariable()
    func lock() { mutex.lock() }
    func unlock() { mutex.unlock() }
    func wait() { variable.wait(releasing: mutex) }
    func signal() { variable.signal() }
    func broadcast() { variable.broadcast() }
}

final class NSConditionPair: ConditionPair, @unchecked Sendable {
    let condition = NSCondition()
    func lock() { condition.lock() }
    func unlock() { condition.unlock() }
    func wait() { condition.wait() }
    func signal() { condition.signal() }
    func broadcast() { condition.broadcast() }
}

final class PthreadPair: ConditionPair, @unchecked Sendable {
    // @unchecked: pthread objects are thread-safe; they sit on their own
    // cache lines and never move.
    let mutex: UnsafeMutablePointer<pthread_mutex_t> = allocateOnOwnCacheLine(pthread_mutex_t())
    let cond: UnsafeMutablePointer<pthread_cond_t> = allocateOnOwnCacheLine(pthread_cond_t())
    init() {
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attributes)
        pthread_condattr_destroy(&attributes)
    }
    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }
    func wait() { pthread_cond_wait(cond, mutex) }
    func signal() { pthread_cond_signal(cond) }
    func broadcast() { pthread_cond_broadcast(cond) }
    /// Waits at most `timeout` (monotonic clock, like Spindle's deadlines).
    func wait(timeout nanoseconds: Int) {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let total = Int(now.tv_nsec) + nanoseconds
        var deadline = timespec(tv_sec: now.tv_sec + total / 1_000_000_000, tv_nsec: total % 1_000_000_000)
        pthread_cond_timedwait(cond, mutex, &deadline)
    }
}

// MARK: - Bodies

/// Ping-pong: `turn` is 0 when it is the benchmark thread's, 1 when it is
/// the partner's. The partner holds the lock except while it waits.
func conditionPingPong<Pair: ConditionPair>(_ pair: Pair) -> (Benchmark) -> Void {
    let turn = Guarded(0)
    let partner = StartOnce {
        startDetachedThread {
            pair.lock()
            while true {
                while turn.value != 1 { pair.wait() }
                turn.value = 0
                pair.signal()
            }
        }
    }
    return { benchmark in
        partner.once()
        for _ in benchmark.scaledIterations {
            pair.lock()
            turn.value = 1
            pair.signal()
            while turn.value != 0 { pair.wait() }
            pair.unlock()
        }
    }
}

/// A bounded buffer of Ints on one condition (NSCondition's shape: one lock,
/// one condition, so a state change that may release the other side
/// broadcasts). The benchmark thread produces; `consumers` threads consume.
/// One operation is one item through the buffer.
final class BoundedBuffer: @unchecked Sendable {
    // @unchecked: every field is accessed under the pair's lock.
    static let capacity = 16
    var slots = [Int](repeating: 0, count: BoundedBuffer.capacity)
    var head = 0
    var count = 0
    var consumed = 0
}

func producerConsumer<Pair: ConditionPair>(_ pair: Pair, consumers: Int) -> (Benchmark) -> Void {
    let buffer = BoundedBuffer()
    let start = StartOnce {
        for _ in 0..<consumers {
            startDetachedThread {
                while true {
                    pair.lock()
                    while buffer.count == 0 { pair.wait() }
                    if buffer.count == BoundedBuffer.capacity { pair.broadcast() }  // the producer may wait
                    let item = buffer.slots[buffer.head]
                    buffer.head = (buffer.head + 1) % BoundedBuffer.capacity
                    buffer.count -= 1
                    buffer.consumed &+= item
                    pair.unlock()
                }
            }
        }
    }
    return { benchmark in
        start.once()
        for i in benchmark.scaledIterations {
            pair.lock()
            while buffer.count == BoundedBuffer.capacity { pair.wait() }
            if buffer.count == 0 { pair.broadcast() }  // consumers may wait
            buffer.slots[(buffer.head + buffer.count) % BoundedBuffer.capacity] = i
            buffer.count += 1
            pair.unlock()
        }
    }
}

/// The same bounded buffer on one lock and two condition variables ("not
/// empty", "not full"), the POSIX shape, which signals every item instead of
/// broadcasting on transitions: Spindle's Lock with two ConditionVariables
/// (row "Spindle.ConditionVariable.two", beside "pthread.cond.two").
func producerConsumerTwoVariables(consumers: Int) -> (Benchmark) -> Void {
    let mutex = Spindle.Lock()
    let notEmpty = ConditionVariable()
    let notFull = ConditionVariable()
    let buffer = BoundedBuffer()
    let start = StartOnce {
        for _ in 0..<consumers {
            startDetachedThread {
                while true {
                    mutex.lock()
                    while buffer.count == 0 { notEmpty.wait(releasing: mutex) }
                    let item = buffer.slots[buffer.head]
                    buffer.head = (buffer.head + 1) % BoundedBuffer.capacity
                    buffer.count -= 1
                    buffer.consumed &+= item
                    notFull.signal()
                    mutex.unlock()
                }
            }
        }
    }
    return { benchmark in
        start.once()
        for i in benchmark.scaledIterations {
            mutex.lock()
            while buffer.count == BoundedBuffer.capacity { notFull.wait(releasing: mutex) }
            buffer.slots[(buffer.head + buffer.count) % BoundedBuffer.capacity] = i
            buffer.count += 1
            notEmpty.signal()
            mutex.unlock()
        }
    }
}

/// The two-variable bounded buffer on pthread_mutex_t and two pthread_cond_t.
func producerConsumerTwoPthreadConditions(consumers: Int) -> (Benchmark) -> Void {
    let notEmpty = PthreadPair()
    let notFull = PthreadPair()  // only its condition is used, with notEmpty's mutex
    let buffer = BoundedBuffer()
    let start = StartOnce {
        for _ in 0..<consumers {
            startDetachedThread {
                while true {
                    pthread_mutex_lock(notEmpty.mutex)
                    while buffer.count == 0 { pthread_cond_wait(notEmpty.cond, notEmpty.mutex) }
                    let item = buffer.slots[buffer.head]
                    buffer.head = (buffer.head + 1) % BoundedBuffer.capacity
                    buffer.count -= 1
                    buffer.consumed &+= item
                    pthread_cond_signal(notFull.cond)
                    pthread_mutex_unlock(notEmpty.mutex)
                }
            }
        }
    }
    return { benchmark in
        start.once()
        for i in benchmark.scaledIterations {
            pthread_mutex_lock(notEmpty.mutex)
            while buffer.count == BoundedBuffer.capacity { pthread_cond_wait(notFull.cond, notEmpty.mutex) }
            buffer.slots[(buffer.head + buffer.count) % BoundedBuffer.capacity] = i
            buffer.count += 1
            pthread_cond_signal(notEmpty.cond)
            pthread_mutex_unlock(notEmpty.mutex)
        }
    }
}

/// A broadcast round: the benchmark thread opens a new generation and
/// broadcasts; each of `waiters` threads sees it, reports in, and the last
/// one broadcasts back. One operation is one full round.
final class Rounds: @unchecked Sendable {
    // @unchecked: every field is accessed under the pair's lock.
    var generation = 0
    var arrived = 0
}

func broadcastRound<Pair: ConditionPair>(_ pair: Pair, waiters: Int) -> (Benchmark) -> Void {
    let rounds = Rounds()
    let start = StartOnce {
        for _ in 0..<waiters {
            startDetachedThread {
                pair.lock()
                // Not `rounds.generation`: the first round may have begun
                // before this thread ran, and it must take part in it.
                var seen = 0
                while true {
                    while rounds.generation == seen { pair.wait() }
                    seen = rounds.generation
                    rounds.arrived += 1
                    if rounds.arrived == waiters { pair.broadcast() }
                }
            }
        }
    }
    return { benchmark in
        start.once()
        for _ in benchmark.scaledIterations {
            pair.lock()
            rounds.arrived = 0
            rounds.generation += 1
            pair.broadcast()
            while rounds.arrived < waiters { pair.wait() }
            pair.unlock()
        }
    }
}

// MARK: - Registration

let benchmarks: @Sendable () -> Void = {
    // Hand-offs take microseconds: 1,000 round trips per measured iteration.
    // One thread waits for another in every one: CPU time per round trip
    // beside the wall clock, for every implementation.
    let handOffs = RunSettings(
        scalingFactor: .kilo, maxDuration: .seconds(1), maxIterations: 1_000, warmupIterations: 3,
        reportedMetrics: [.cpuPerOperation])
    // A timed wait takes its timeout: one wait per measured iteration.
    let timedWaits = RunSettings(
        scalingFactor: .one, maxDuration: .milliseconds(300), maxIterations: 1_000, warmupIterations: 3)

    // MARK: Condition and ConditionVariable

    sideBySide(
        group: "condition.pingpong 2 threads",
        settings: handOffs,
        implementations: [
            .init("Spindle.Condition", isReference: false, body: conditionPingPong(SpindleConditionPair())),
            .init("Spindle.ConditionVariable", isReference: false, body: conditionPingPong(SpindleVariablePair())),
            .reference("NSCondition", body: conditionPingPong(NSConditionPair())),
            .peer("pthread.cond", body: conditionPingPong(PthreadPair())),
        ]
    )

    for consumers in [1, 3] {
        sideBySide(
            group: "condition.producer-consumer 1 producer \(consumers) consumers capacity 16",
            settings: handOffs,
            implementations: [
                .init("Spindle.Condition", isReference: false,
                      body: producerConsumer(SpindleConditionPair(), consumers: consumers)),
                .init("Spindle.ConditionVariable", isReference: false,
                      body: producerConsumer(SpindleVariablePair(), consumers: consumers)),
                .init("Spindle.ConditionVariable.two", isReference: false,
                      body: producerConsumerTwoVariables(consumers: consumers)),
                .reference("NSCondition", body: producerConsumer(NSConditionPair(), consumers: consumers)),
                .peer("pthread.cond", body: producerConsumer(PthreadPair(), consumers: consumers)),
                .peer("pthread.cond.two", body: producerConsumerTwoPthreadConditions(consumers: consumers)),
            ]
        )
    }

    sideBySide(
        group: "condition.broadcast round 4 waiters",
        settings: RunSettings(
            scalingFactor: .kilo, maxDuration: .seconds(1), maxIterations: 1_000, warmupIterations: 1,
            reportedMetrics: [.cpuPerOperation]),
        implementations: [
            .init("Spindle.Condition", isReference: false, body: broadcastRound(SpindleConditionPair(), waiters: 4)),
            .init("Spindle.ConditionVariable", isReference: false,
                  body: broadcastRound(SpindleVariablePair(), waiters: 4)),
            .reference("NSCondition", body: broadcastRound(NSConditionPair(), waiters: 4)),
            .peer("pthread.cond", body: broadcastRound(PthreadPair(), waiters: 4)),
        ]
    )

    do {
        // How late a timed wait with no signal returns: the row's time minus 1 ms.
        let condition = Condition()
        let nsCondition = NSCondition()
        let pthread = PthreadPair()
        sideBySide(
            group: "condition.wait timeout 1 ms",
            settings: timedWaits,
            implementations: [
                .init("Spindle.Condition", isReference: false) { benchmark in
                    for _ in benchmark.scaledIterations {
                        condition.lock()
                        blackHole(condition.wait(timeout: .milliseconds(1)))
                        condition.unlock()
                    }
                },
                .reference("NSCondition") { benchmark in
                    for _ in benchmark.scaledIterations {
                        nsCondition.lock()
                        blackHole(nsCondition.wait(until: Date(timeIntervalSinceNow: 0.001)))
                        nsCondition.unlock()
                    }
                },
                .peer("pthread.cond") { benchmark in
                    for _ in benchmark.scaledIterations {
                        pthread.lock()
                        pthread.wait(timeout: 1_000_000)
                        pthread.unlock()
                    }
                },
            ]
        )
    }

    // MARK: Semaphore

    do {
        let semaphore = Semaphore(value: 1)
        let dispatch = DispatchSemaphore(value: 1)
        sideBySide(
            group: "semaphore.wait+signal uncontended",
            spindle: { benchmark in
                for _ in benchmark.scaledIterations {
                    semaphore.wait()
                    blackHole(semaphore.signal())
                }
            },
            peers: [
                .reference("DispatchSemaphore") { benchmark in
                    for _ in benchmark.scaledIterations {
                        dispatch.wait()
                        blackHole(dispatch.signal())
                    }
                },
            ]
        )
    }

    do {
        // A pair of semaphores: the benchmark thread signals `ping` and waits
        // on `pong`; the partner waits on `ping` and signals `pong`.
        let ping = Semaphore(value: 0)
        let pong = Semaphore(value: 0)
        let spindlePartner = StartOnce {
            startDetachedThread {
                while true {
                    ping.wait()
                    pong.signal()
                }
            }
        }
        let dispatchPing = DispatchSemaphore(value: 0)
        let dispatchPong = DispatchSemaphore(value: 0)
        let dispatchPartner = StartOnce {
            startDetachedThread {
                while true {
                    dispatchPing.wait()
                    dispatchPong.signal()
                }
            }
        }
        sideBySide(
            group: "semaphore.pingpong 2 threads",
            settings: handOffs,
            spindle: { benchmark in
                spindlePartner.once()
                for _ in benchmark.scaledIterations {
                    ping.signal()
                    pong.wait()
                }
            },
            peers: [
                .reference("DispatchSemaphore") { benchmark in
                    dispatchPartner.once()
                    for _ in benchmark.scaledIterations {
                        dispatchPing.signal()
                        dispatchPong.wait()
                    }
                },
            ]
        )
    }

    do {
        let semaphore = Semaphore(value: 0)
        let dispatch = DispatchSemaphore(value: 0)
        sideBySide(
            group: "semaphore.wait timeout 1 ms",
            settings: timedWaits,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations {
                    blackHole(semaphore.wait(timeout: .milliseconds(1)))
                }
            },
            peers: [
                .reference("DispatchSemaphore") { benchmark in
                    for _ in benchmark.scaledIterations {
                        blackHole(dispatch.wait(timeout: .now() + .milliseconds(1)))
                    }
                },
            ]
        )
    }

    // MARK: ConditionLock

    do {
        // The benchmark thread takes the lock when the condition is 0 and
        // leaves it at 1; the partner takes it at 1 and leaves it at 0.
        let spindle = Spindle.ConditionLock(condition: 0)
        let spindlePartner = StartOnce {
            startDetachedThread {
                while true {
                    spindle.lock(whenCondition: 1)
                    spindle.unlock(withCondition: 0)
                }
            }
        }
        // NSConditionLock.lock(whenCondition:) waits until Date.distantFuture,
        // which traps in swift-corelibs-foundation's NSCondition.wait(until:)
        // on Linux as soon as it has to wait; an hour away does not.
        let foundation = NSConditionLock(condition: 0)
        let anHourAway: @Sendable () -> Date = { Date(timeIntervalSinceNow: 3600) }
        let foundationPartner = StartOnce {
            startDetachedThread {
                while true {
                    _ = foundation.lock(whenCondition: 1, before: anHourAway())
                    foundation.unlock(withCondition: 0)
                }
            }
        }
        let nio = NIOConcurrencyHelpers.ConditionLock(value: 0)
        let nioPartner = StartOnce {
            startDetachedThread {
                while true {
                    nio.lock(whenValue: 1)
                    nio.unlock(withValue: 0)
                }
            }
        }
        sideBySide(
            group: "conditionlock.pingpong 2 threads",
            settings: handOffs,
            implementations: [
                .init("Spindle", isReference: false) { benchmark in
                    spindlePartner.once()
                    for _ in benchmark.scaledIterations {
                        spindle.lock(whenCondition: 0)
                        spindle.unlock(withCondition: 1)
                    }
                },
                .reference("NSConditionLock") { benchmark in
                    foundationPartner.once()
                    for _ in benchmark.scaledIterations {
                        _ = foundation.lock(whenCondition: 0, before: anHourAway())
                        foundation.unlock(withCondition: 1)
                    }
                },
                .peer("NIOConcurrencyHelpers.ConditionLock") { benchmark in
                    nioPartner.once()
                    for _ in benchmark.scaledIterations {
                        nio.lock(whenValue: 0)
                        nio.unlock(withValue: 1)
                    }
                },
            ]
        )
    }
}
