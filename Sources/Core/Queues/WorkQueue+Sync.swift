import CShims

extension WorkQueue {
    /// Runs `body` on the queue and waits for it: returns its value, throws
    /// its error. Blocks the caller until the queue reaches the item (a
    /// blocking region on a pool worker).
    ///
    /// When the queue (and every serial queue along its target chain) is
    /// idle, the caller's own thread runs `body` at once, with no thread
    /// switch; otherwise the item is queued and runs on a worker while the
    /// caller waits. On a concurrent queue the caller is already running on,
    /// `body` runs at once (as in libdispatch; the guide advises against it).
    /// On a global queue, `body` runs at once on the caller's thread.
    ///
    /// `body` need not be `@Sendable`: the caller waits while it runs, so
    /// nothing it captures is used by two threads at once.
    ///
    /// Stops the process with a message naming the queue if the caller runs
    /// on this serial queue or one along its target chain (it would wait for
    /// itself forever), or calls it on the main thread for a queue that runs
    /// on the main queue.
    public func sync<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        if isGlobal { return try QueueFrame.with(self, body) }
        if cshims_queue_frame() != nil || isMain {
            if kind == .concurrent && QueueFrame.contains(self) { return try runReentrant(body) }
            requireNoDeadlock("sync(_:)", barrier: false)
        }
        if let value = try runClaimed(barrier: false, body) { return value }
        return try runQueued(barrier: false, body)
    }

    /// `sync` as a barrier: waits for everything submitted before it, runs
    /// `body` alone, and returns before anything submitted after it starts.
    /// On a serial queue it is `sync`. Stops the process on a global queue,
    /// and when the caller runs on this queue.
    public func syncBarrier<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        requireBarrierAllowed("syncBarrier(_:)")
        if cshims_queue_frame() != nil || isMain { requireNoDeadlock("syncBarrier(_:)", barrier: true) }
        if let value = try runClaimed(barrier: kind == .concurrent, body) { return value }
        return try runQueued(barrier: kind == .concurrent, body)
    }

    /// Stops the process if waiting for an item of this queue would wait for
    /// the caller itself.
    func requireNoDeadlock(_ api: String, barrier: Bool) {
        var next: WorkQueue? = self
        while let queue = next {
            if queue.isGlobal { return }
            if queue.isMain {
                if NativeThread.isMainThread {
                    let via = queue === self ? "" : " (the target of '\(label)')"
                    misuse("WorkQueue.\(api) onto '\(label)' on the main thread: the main queue\(via) runs its items on this thread, which would wait for itself forever")
                }
                return
            }
            if (queue.kind == .serial || (barrier && queue === self)) && QueueFrame.contains(queue) {
                let via = queue === self ? "" : " through its target chain ('\(queue.label)')"
                misuse("WorkQueue.\(api) onto '\(label)'\(via) from an item running on '\(queue.label)': the queue would wait for the caller, which waits for the queue; this deadlock is refused")
            }
            next = queue.target
        }
    }

    /// A concurrent queue the caller already runs on: run now.
    private func runReentrant<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        lock.lock()
        running += 1
        lock.unlock()
        defer { releaseClaim(barrier: false) }
        return try QueueFrame.with(self, body)
    }

    /// The idle fast path: claims this queue and each private queue along the
    /// target chain, then runs `body` on the caller's thread inside their
    /// frames. Nil (having claimed nothing) when any of them is busy,
    /// suspended, or has items waiting, or when the chain reaches the main
    /// queue.
    func runClaimed<T, E: Error>(barrier: Bool, _ body: () throws(E) -> T) throws(E) -> T? {
        guard let target = tryClaim(barrier: barrier) else { return nil }
        defer { releaseClaim(barrier: barrier) }
        if target.isGlobal { return try QueueFrame.with(target) { () throws(E) -> T in try QueueFrame.with(self, body) } }
        if target.isMain { return nil }
        return try target.runClaimed(barrier: false) { () throws(E) -> T in try QueueFrame.with(self, body) }
    }

    /// Takes a running slot (or the barrier) if the queue is idle enough to
    /// run an item now without overtaking a queued one; returns the target.
    private func tryClaim(barrier: Bool) -> WorkQueue? {
        lock.lock()
        defer { lock.unlock() }
        guard suspendCount == 0, !barrierActive, entries.isEmpty, let target = targetQueue else { return nil }
        if barrier {
            guard running == 0 else { return nil }
            barrierActive = true
        } else {
            guard running < width else { return nil }
            running += 1
        }
        return target
    }

    /// Gives back what `tryClaim` (or `runReentrant`) took and schedules
    /// drains for items that arrived meanwhile.
    func releaseClaim(barrier: Bool) {
        lock.lock()
        if barrier { barrierActive = false } else { running -= 1 }
        var extra = 0
        while claimDrainerLocked() { extra += 1 }
        let target = targetQueue
        lock.unlock()
        for _ in 0..<extra { scheduleDrain(on: target) }
    }

    /// The slow path: queue the call, wait for a worker to run it.
    private func runQueued<T, E: Error>(barrier: Bool, _ body: () throws(E) -> T) throws(E) -> T {
        try withoutActuallyEscaping(body) { (escapable) throws(E) -> T in
            let call = SyncCall<T, E>(escapable)
            let job: @Sendable () -> Void = { call.run() }
            enqueue(barrier ? .barrier(job, nil) : .closure(job))
            call.wait()
            return try call.take()
        }
    }
}

/// One queued `sync` call: the caller's closure, its outcome, and the word
/// the caller sleeps on.
private final class SyncCall<T, E: Error>: @unchecked Sendable {
    // @unchecked: `body` and `outcome` are written by the worker before its
    // releasing store to `done`, and read by the caller after its acquiring
    // load of it; never at the same time.
    private var body: (() throws(E) -> T)?
    private var outcome: Result<T, E>?
    private let done: UnsafeMutablePointer<UInt32>

    init(_ body: @escaping () throws(E) -> T) {
        self.body = body
        done = allocateStableWords(byteCount: 4).assumingMemoryBound(to: UInt32.self)
    }

    deinit { UnsafeMutableRawPointer(done).deallocate() }

    /// On the worker. Lets go of the caller's closure before waking it: the
    /// closure is the caller's non-escaping one, and must be gone when the
    /// caller returns.
    func run() {
        do {
            let body = self.body!
            self.body = nil
            outcome = Result { () throws(E) -> T in try body() }
        }
        // Pairs with the acquiring load in `wait`.
        AtomicMemory.store(1, to: done, ordering: .releasing)
        Futex(done).wake()
    }

    func wait() {
        if AtomicMemory.load(from: done, ordering: .acquiring) == 1 { return }
        announcingBlocking {
            while AtomicMemory.load(from: done, ordering: .acquiring) == 0 {
                _ = Futex(done).wait(expecting: 0)
            }
        }
    }

    func take() throws(E) -> T {
        try outcome!.get()
    }
}
