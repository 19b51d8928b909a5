import CShims

/// Async forms of Spindle's waits: each suspends the calling task instead of
/// blocking its thread (a cooperative thread blocked in a wait is a thread
/// the whole program's tasks lose). The blocking forms are marked
/// `noasync`, so the compiler points at a blocking wait in async code.
///
/// Cancellation: a task cancelled while it waits (or before it has to) ends
/// the wait at once and the call throws `CancellationError`, as
/// `Task.sleep` does; what it waited for goes on without it (a group's
/// members, an item, a job, a thread). A wait that needs none (the group
/// already empty, the item or job already finished) returns normally even
/// in a cancelled task. `ThreadLoop.performReturning` is not a wait and is
/// not cut short: its block is on the loop already.

extension WorkGroup {
    /// Suspends the calling task until the group is empty; returns at once
    /// if it is. No thread waits: a notification on the default global
    /// queue resumes the task. Memory: sees everything the members wrote.
    /// Throws `CancellationError` if the task is cancelled first.
    public func wait() async throws(CancellationError) {
        _ = try await wait(until: .distantFuture)
    }

    /// Suspends the calling task until the group is empty or `deadline`
    /// passes (a timer of `WorkQueue.async(after:)` ends the wait; the
    /// notification stays registered until the group empties). Throws
    /// `CancellationError` if the task is cancelled first.
    public func wait(until deadline: MonotonicClock.Instant) async throws(CancellationError) -> WaitResult {
        if AtomicMemory.load(from: countWord, ordering: .acquiring) & Self.countMask == 0 { return .completed }
        return try await suspendUntilNotified(until: deadline) { notify(on: .global(), $0) }
    }

    /// Suspends the calling task until the group is empty or `timeout` has
    /// passed. Throws `CancellationError` if the task is cancelled first.
    public func wait(timeout: Duration) async throws(CancellationError) -> WaitResult {
        try await wait(until: MonotonicClock.now.advanced(by: timeout))
    }
}

extension WorkItem {
    /// Suspends the calling task until the item has finished (run, or
    /// skipped as cancelled). No thread waits: a notification on the default
    /// global queue resumes the task. Throws `CancellationError` if the
    /// task is cancelled first (the item is not cancelled with it).
    public func wait() async throws(CancellationError) {
        _ = try await wait(until: .distantFuture)
    }

    /// Suspends the calling task until the item has finished or `deadline`
    /// passes. Throws `CancellationError` if the task is cancelled first.
    public func wait(until deadline: MonotonicClock.Instant) async throws(CancellationError) -> WaitResult {
        if isFinished { return .completed }
        return try await suspendUntilNotified(until: deadline) { notify(on: .global(), $0) }
    }

    /// Suspends the calling task until the item has finished or `timeout`
    /// has passed. Throws `CancellationError` if the task is cancelled first.
    public func wait(timeout: Duration) async throws(CancellationError) -> WaitResult {
        try await wait(until: MonotonicClock.now.advanced(by: timeout))
    }
}

/// How a suspended wait ended. Whichever of the notification, the timer and
/// the task's cancellation comes first resumes the task; the others find it
/// resumed and do nothing.
private enum WaitOutcome: Sendable {
    case completed, timedOut, cancelled
}

/// The continuation of one suspended wait, resumed once by whichever comes
/// first: its outcome may arrive before the continuation is in place (a
/// cancellation that raced the suspension), and is then kept for it.
private final class OneResumption: @unchecked Sendable {
    // @unchecked: everything is guarded by `lock`.
    private let lock = GuardLock()
    private var continuation: CheckedContinuation<WaitOutcome, Never>?
    private var outcome: WaitOutcome?

    func install(_ continuation: CheckedContinuation<WaitOutcome, Never>) {
        lock.lock()
        if let outcome {
            lock.unlock()
            continuation.resume(returning: outcome)
            return
        }
        self.continuation = continuation
        lock.unlock()
    }

    /// Resumes the task with `result` unless something else did (or will:
    /// an outcome kept before the continuation is in place).
    func finish(_ result: WaitOutcome) {
        lock.lock()
        guard outcome == nil else {
            lock.unlock()
            return
        }
        outcome = result
        let continuation = self.continuation.take()
        lock.unlock()
        continuation?.resumeOutsideTSan(returning: result)
    }

    /// The outcome, read under the lock by the task once resumed. Besides
    /// the value, the lock carries the hand-over to ThreadSanitizer: what
    /// the finishing thread wrote before `finish` then happens before the
    /// task goes on, even when the continuation was resumed before the task
    /// suspended, a hand-over the Swift runtime makes through an atomic
    /// ThreadSanitizer does not see (see `handedOver`).
    var settled: WaitOutcome {
        lock.lock()
        defer { lock.unlock() }
        guard let outcome else { misuse("OneResumption: the task went on before an outcome was set") }
        return outcome
    }
}

/// Runs `start`, which arranges for another thread to compute a result and
/// pass it to the function it is given, and suspends the calling task
/// until it has; returns the result's value or throws its error.
///
/// The result goes through a lock, not through the continuation: the Swift
/// runtime tells ThreadSanitizer that a resume happens before the task runs
/// again only when the task had suspended first. Resumed before it
/// suspended (a pool worker that runs the body at once), the task goes on
/// through an atomic of the runtime's that ThreadSanitizer does not see,
/// and it reports what the resuming thread wrote (an object the body made)
/// as a race with the task's reads. A lock costs a few nanoseconds beside
/// the hop. It is an internal guard, which the lock-order checker does not
/// track: a task holding a lock of its own meets a new box at each call.
private func handedOver<T: Sendable>(
    _ start: (@escaping @Sendable (Result<T, any Error>) -> Void) -> Void
) async throws -> T {
    let box = HandOverBox<T>()
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        start { result in
            box.put(result)
            continuation.resumeOutsideTSan()
        }
    }
    return try box.take().get()
}

/// The result `handedOver` passes, under a guard.
private final class HandOverBox<T: Sendable>: @unchecked Sendable {
    // @unchecked: `result` is guarded by `lock`.
    private let lock = GuardLock()
    private var result: Result<T, any Error>?

    func put(_ result: Result<T, any Error>) {
        lock.lock()
        self.result = result
        lock.unlock()
    }

    func take() -> Result<T, any Error> {
        lock.lock()
        let result = self.result.take()
        lock.unlock()
        guard let result else { misuse("handedOver: the task was resumed without a result") }
        return result
    }
}

/// Suspends until `register`'s notification runs (`.completed`),
/// `deadline` passes (`.timedOut`) or the task is cancelled (throws),
/// whichever comes first.
private func suspendUntilNotified(
    until deadline: MonotonicClock.Instant, _ register: (@escaping @Sendable () -> Void) -> Void
) async throws(CancellationError) -> WaitResult {
    let once = OneResumption()
    _ = await withTaskCancellationHandler {
        await withCheckedContinuation { (continuation: CheckedContinuation<WaitOutcome, Never>) in
            once.install(continuation)
            register { once.finish(.completed) }
            if !deadline.isDistantFuture {
                WorkQueue.global().async(after: deadline) { once.finish(.timedOut) }
            }
        }
    } onCancel: {
        once.finish(.cancelled)
    }
    switch once.settled {
    case .completed: return .completed
    case .timedOut: return .timedOut
    case .cancelled: throw CancellationError()
    }
}

extension Job {
    /// Suspends the calling task until the job has finished (its state
    /// became `finished`). No thread waits: an observer resumes the task.
    /// Throws `CancellationError` if the task is cancelled first (the job
    /// is not cancelled with it; its observer is removed).
    public func waitUntilFinished() async throws(CancellationError) {
        if isFinished { return }
        let once = OneResumption()
        let observer = LockedValue<Int?>(nil)
        _ = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<WaitOutcome, Never>) in
                once.install(continuation)
                let id = observe { event in
                    if case .finished = event { once.finish(.completed) }
                }
                observer.withLock { $0 = id }
                // Finished before the observer was in place: nobody will call it.
                if isFinished { once.finish(.completed) }
            }
        } onCancel: {
            once.finish(.cancelled)
        }
        if let id = observer.withLock({ $0 }) { removeObserver(id) }
        if case .cancelled = once.settled { throw CancellationError() }
    }
}

extension SpawnedThread {
    /// Suspends the calling task until the thread has ended; returns what
    /// its body returned, throws what it threw. The join itself runs on a
    /// pool worker in a blocking region (Linux has no way to be told of a
    /// thread's end without a thread waiting for it), so the pool starts
    /// another worker meanwhile. Misuse as for `join()`.
    ///
    /// Cancelling the task throws `CancellationError` at once; the join
    /// goes on on the pool worker and its result is dropped, so the thread
    /// is still joined (nothing leaks) and may not be joined again.
    public func join() async throws -> Value {
        let once = OneResumption()
        let result = LockedValue<Result<Value, any Error>?>(nil)
        _ = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<WaitOutcome, Never>) in
                once.install(continuation)
                WorkQueue.global().async {
                    let joined = Result { try self.join() }
                    result.withLock { $0 = joined }
                    once.finish(.completed)
                }
            }
        } onCancel: {
            once.finish(.cancelled)
        }
        if case .cancelled = once.settled { throw CancellationError() }
        return try result.withLock { $0 }!.get()
    }
}

extension ThreadLoop {
    /// Runs `body` on the loop's thread as a perform in `modes` and returns
    /// its value or throws its error, suspending the calling task (not
    /// blocking its thread) meanwhile. Stops the process if the loop's
    /// thread has exited (the block could never run).
    public func performReturning<T: Sendable>(
        inModes modes: [LoopMode] = [.common], _ body: @escaping @Sendable () throws -> T
    ) async throws -> T {
        try await handedOver { deliver in
            let accepted = perform(inModes: modes) { deliver(Result { try body() }) }
            if !accepted {
                misuse("ThreadLoop.performReturning(_:): \(self)'s thread has exited; the block could never run")
            }
        }
    }
}

extension WorkQueue {
    /// Runs `body` on the queue as an item (in the queue's order: after the
    /// items submitted before it, on a serial queue alone) and returns its
    /// value or throws its error, suspending the calling task, not blocking
    /// its thread, meanwhile: the async form of `sync(_:)`. Memory: the
    /// task sees everything `body` wrote. Not cut short by cancellation:
    /// `body` is on the queue already. A `body` that blocks (a port's send,
    /// a lookup) blocks a pool worker, not the caller's cooperative thread.
    public func performReturning<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await handedOver { deliver in
            async { deliver(Result { try body() }) }
        }
    }
}

// MARK: Resuming a task across threads

// A resume from another thread than the suspending task's races, for
// ThreadSanitizer, with the task's own first steps when the resume lands
// before the task has finished suspending: the runtime then lets the task
// go on through an atomic of its own, without the acquire it tells
// ThreadSanitizer about when the task had suspended first (swiftlang/swift
// #57803, still so in 6.3). What races is the runtime's bookkeeping in the
// task's frame: the resume reads where the result goes and writes it, the
// task's next partial function writes the same slots. No code of Spindle's
// runs in between to order them, so the resume's own accesses are kept out
// of ThreadSanitizer's sight instead, and only those: what the resuming
// thread wrote before is still checked, and the runtime's release still
// counts. In a build without ThreadSanitizer it is a plain resume.
extension UnsafeContinuation {
    @inline(__always)
    func resumeOutsideTSan(returning value: sending T) {
        cshims_tsan_ignore_accesses_begin()
        resume(returning: value)
        cshims_tsan_ignore_accesses_end()
    }
}

extension CheckedContinuation {
    @inline(__always)
    func resumeOutsideTSan(returning value: sending T) {
        cshims_tsan_ignore_accesses_begin()
        resume(returning: value)
        cshims_tsan_ignore_accesses_end()
    }
}

extension CheckedContinuation where T == Void {
    @inline(__always)
    func resumeOutsideTSan() { resumeOutsideTSan(returning: ()) }
}
