import CShims

extension WorkQueue {
    /// Calls `body(i)` for every `i` in `0..<iterations`, exactly once each,
    /// and returns when all have returned: the guide's `dispatch_apply`.
    ///
    /// Where the iterations run, by the queue's shape:
    /// - **A global queue**: the iterations are cut into chunks that the
    ///   calling thread and up to `width - 1` helper items on the pool claim
    ///   one at a time (one atomic add per chunk, none per iteration); chunks
    ///   run at once and finish in any order, so `body` must be safe to call
    ///   from several threads (it is `@Sendable`).
    /// - **A concurrent queue of your own** keeps its exclusion, as `sync`
    ///   does. The caller first holds the queue and its target chain the way
    ///   `sync` holds them: so `apply` waits while a barrier runs (or is
    ///   queued ahead) on the queue or any queue of its chain, and while a
    ///   serial queue of the chain runs another item. Then it reserves, on
    ///   each queue of the chain, as much further width as that queue has
    ///   free, and runs that many helpers beside itself, as above. A serial
    ///   queue (or the main queue) on the chain has nothing more to give, so
    ///   there the iterations run one after another on the thread that holds
    ///   the chain, as one `sync` item. The reservation lasts until the last
    ///   iteration has returned: a barrier submitted meanwhile waits for
    ///   every iteration, and items of a serial queue of the chain wait for
    ///   the whole `apply`. Inside an iteration, `WorkQueue.current` is the
    ///   queue and `isCurrent` holds for its chain.
    /// - **A suspended queue** (or one whose chain holds a suspended queue)
    ///   starts nothing, and `apply` waits until it is resumed, as `sync`
    ///   on it does: the suspension is part of the exclusion `apply` keeps,
    ///   and one call that overtook it would make `suspend()` a promise with
    ///   an exception. A `suspend()` once `apply` holds the queue stops it
    ///   no more than it stops a running item: the iterations run to the end.
    /// - **A serial queue** (or the main queue): the iterations run one after
    ///   another as one `sync` item: allowed, correct, and no faster.
    ///
    /// `stride`: the guide's striding advice. Each chunk is `stride`
    /// consecutive iterations, `iterations / stride` of them, and the caller
    /// runs the `iterations % stride` left over itself at the end. Without
    /// it, chunks are sized so that each thread claims about eight.
    ///
    /// Blocks the caller until every iteration has finished (a blocking
    /// region on a pool worker), and before that for as long as `sync` on
    /// the queue would. Memory: what the caller wrote before the call is
    /// visible to every iteration, and what each iteration wrote is visible
    /// to the caller when `apply` returns and to the queue's later items.
    ///
    /// Called from an item of the queue itself (or from one of its
    /// iterations), `apply` runs at once, as `sync` does there. Stops the
    /// process for a negative count or stride, and, with `sync`'s message
    /// naming `apply`, when the caller runs on the queue (serial), on a
    /// serial queue along its target chain or as a barrier on a queue along
    /// it, or on the main thread for a queue that runs on the main queue:
    /// it would wait for itself.
    public func apply(iterations: Int, stride: Int? = nil, _ body: @Sendable (Int) -> Void) {
        require(iterations >= 0, "WorkQueue.apply(iterations:): `iterations` is \(iterations); it must be 0 or more")
        if let stride {
            require(stride > 0, "WorkQueue.apply(iterations:stride:): `stride` is \(stride); it must be at least 1")
        }
        guard iterations > 0 else { return }
        if isGlobal {
            // No chain and no exclusion to keep: straight on the pool.
            let plan = ApplyPlan(iterations: iterations, stride: stride, threads: effectivePool.width)
            return QueueFrame.with(self) { applyOnPool(plan, helpers: plan.helpers, root: self, body) }
        }
        if cshims_queue_frame() != nil || isMain || NativeThread.isMainThread {
            // Inside an item of this concurrent queue `sync` runs at once;
            // anywhere else, refuse what would wait for the caller.
            if kind == .serial || !QueueFrame.contains(self) {
                requireNoDeadlock("apply(iterations:)", barrier: false)
            }
        }
        if kind == .serial {
            return sync { for i in 0..<iterations { body(i) } }
        }
        sync { applyHoldingChain(iterations: iterations, stride: stride, body) }
    }

    /// `apply` on the default global queue: Dispatch's `concurrentPerform`.
    public static func concurrentPerform(iterations: Int, _ body: @Sendable (Int) -> Void) {
        WorkQueue.global().apply(iterations: iterations, body)
    }

    /// `apply`'s work on a concurrent queue of one's own, run by whoever
    /// holds the queue and its chain (the `sync` caller, or the worker that
    /// runs its queued call), inside their frames.
    private func applyHoldingChain(iterations: Int, stride: Int?, _ body: @Sendable (Int) -> Void) {
        let plan = ApplyPlan(iterations: iterations, stride: stride, threads: effectivePool.width)
        guard plan.helpers > 0 else {
            for i in 0..<iterations { body(i) }
            return
        }
        let reservation = reserveApplyWidth(plan.helpers)
        guard reservation.width > 0 else {
            // A serial queue, a barrier or a full queue on the chain: the
            // holder alone, one iteration after another.
            for i in 0..<iterations { body(i) }
            return
        }
        defer { for queue in reservation.held { queue.releaseApplyWidth(reservation.width) } }
        // Root-first, the frames a helper pushes so that its iterations run
        // inside the queue and its chain as the caller's do (the pool
        // pushes the root's).
        applyOnPool(plan, helpers: reservation.width, root: reservation.root, frames: reservation.held.reversed(), body)
    }

    /// Reserves up to `wanted` more running slots on this queue and on each
    /// queue of its target chain, as libdispatch's apply reserves width: on
    /// each queue, no more than it has free, and what a queue nearer the
    /// root cannot match is given back to those before it. A serial queue
    /// (the main queue included), a running barrier, or a queue whose width
    /// is taken gives nothing, and then nothing stays reserved anywhere.
    /// Takes each queue's lock in turn, never two at once.
    private func reserveApplyWidth(_ wanted: Int) -> (width: Int, held: [WorkQueue], root: WorkQueue) {
        var width = wanted
        var held: [WorkQueue] = []
        var queue = self
        while !queue.isGlobal {
            queue.lockQueue()
            let free = queue.width == 1 || queue.barrierActive ? 0 : max(0, queue.width - queue.running)
            let taken = min(width, free)
            queue.running += taken
            let target = queue.targetQueue
            queue.lock.unlock()
            if taken < width {
                for earlier in held { earlier.releaseApplyWidth(width - taken) }
                width = taken
            }
            if width == 0 { return (0, [], queue) }
            held.append(queue)
            // Only the main queue has no target, and it is serial.
            queue = target!
        }
        return (width, held, queue)
    }

    /// Gives back `count` running slots taken by `reserveApplyWidth`, and
    /// schedules the drains that can start now (a barrier that waited for
    /// them, items that found the width taken).
    private func releaseApplyWidth(_ count: Int) {
        lockQueue()
        running -= count
        var drains = 0
        while claimDrainerLocked() { drains += 1 }
        let target = targetQueue
        lock.unlock()
        for _ in 0..<drains { scheduleDrain(on: target) }
    }

    /// Runs the plan's chunks on the calling thread and `helpers` helper
    /// units submitted to the global queue `root`; each helper pushes
    /// `frames` (outermost first) around its claims. Then runs the
    /// remainder past the last whole stride on the calling thread.
    private func applyOnPool(_ plan: ApplyPlan, helpers: Int, root: WorkQueue, frames: [WorkQueue] = [], _ body: @Sendable (Int) -> Void) {
        if helpers == 0 {
            for i in 0..<plan.covered { body(i) }
        } else {
            withoutActuallyEscaping(body) { escapable in
                let shared = ApplyChunks(body: escapable, chunks: plan.chunks, chunkSize: plan.chunkSize, end: plan.covered)
                for _ in 0..<helpers {
                    if frames.isEmpty {
                        root.submit(.closure { shared.work(asHelper: true) }, shared: true)
                    } else {
                        root.submit(.closure { withFrames(frames[...]) { shared.work(asHelper: true) } }, shared: true)
                    }
                }
                shared.work()
                shared.waitForAll()
            }
        }
        for i in plan.covered..<plan.iterations { body(i) }
    }
}

/// Runs `body` inside a frame for each of `queues`, the first outermost. The
/// closure that calls this holds the queues.
private func withFrames(_ queues: ArraySlice<WorkQueue>, _ body: () -> Void) {
    guard let first = queues.first else { return body() }
    QueueFrame.with(first) { withFrames(queues.dropFirst(), body) }
}

/// How one `apply` cuts its iterations: `chunks` chunks of `chunkSize`
/// covering `0..<covered`, the rest run by the caller at the end.
private struct ApplyPlan {
    let iterations: Int
    let chunkSize: Int
    let chunks: Int
    let covered: Int
    /// Helpers worth starting beside the caller: one per other thread of the
    /// pool, no more than there are chunks to share.
    let helpers: Int

    init(iterations: Int, stride: Int?, threads: Int) {
        self.iterations = iterations
        if let stride {
            chunkSize = stride
            chunks = iterations / stride
        } else {
            chunkSize = max(1, iterations / (threads * 8))
            chunks = (iterations + chunkSize - 1) / chunkSize
        }
        covered = min(iterations, chunks * chunkSize)
        helpers = chunks <= 1 ? 0 : max(0, min(threads - 1, chunks - 1))
    }
}

/// The chunks of one `apply`: a claim counter, a completion counter the
/// caller sleeps on, and the caller's closure.
private final class ApplyChunks: @unchecked Sendable {
    // @unchecked: `body` is read only by threads that claimed a chunk, all of
    // which finish (and count it, releasing) before the caller, after its
    // acquiring wait, clears it; the counters are atomic.
    private var body: (@Sendable (Int) -> Void)?
    private let chunks: Int
    private let chunkSize: Int
    private let end: Int
    /// The fork epoch (`cshims_fork_epoch`) the `apply` started in.
    private let epoch = cshims_fork_epoch()
    /// [0]: next chunk to claim (Int), [64]: chunks finished (UInt32 futex word).
    private let words: UnsafeMutableRawPointer

    init(body: @escaping @Sendable (Int) -> Void, chunks: Int, chunkSize: Int, end: Int) {
        self.body = body
        self.chunks = chunks
        self.chunkSize = chunkSize
        self.end = end
        words = allocateStableWords(byteCount: 128)
    }

    deinit { deallocateStableWords(words) }

    private var next: UnsafeMutablePointer<Int> { words.assumingMemoryBound(to: Int.self) }
    private var finished: UnsafeMutablePointer<UInt32> { (words + 64).assumingMemoryBound(to: UInt32.self) }

    /// Claims and runs chunks until none are left. A helper that starts after
    /// the last claim touches only the counter.
    ///
    /// A helper that runs in a child after `fork()` for an `apply` of the
    /// parent returns at once: the caller's closure lived on a thread the
    /// child does not have (its stack may be another thread's by now).
    func work(asHelper: Bool = false) {
        if asHelper && epoch != cshims_fork_epoch() { return }
        while true {
            let chunk = AtomicMemory.add(1, to: next, ordering: .relaxed) - 1
            if chunk >= chunks { return }
            let start = chunk * chunkSize
            let stop = min(start + chunkSize, end)
            do {
                // Let go of the closure before counting the chunk: once the
                // last chunk is counted the caller returns, and its
                // non-escaping closure must have no other reference then.
                let body = self.body!
                for i in start..<stop { body(i) }
            }
            // Releasing: pairs with the caller's acquiring load.
            let done = AtomicMemory.add(1, to: finished, ordering: .releasing)
            if Int(done) == chunks { Futex(finished).wake() }
        }
    }

    /// The caller, after its own claims: waits for chunks others still run,
    /// then lets go of its closure.
    func waitForAll() {
        var done = AtomicMemory.load(from: finished, ordering: .acquiring)
        if Int(done) < chunks {
            announcingBlocking {
                while Int(done) < chunks {
                    _ = Futex(finished).wait(expecting: done)
                    done = AtomicMemory.load(from: finished, ordering: .acquiring)
                }
            }
        }
        body = nil
    }
}
