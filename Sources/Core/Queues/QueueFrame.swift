import CShims

/// The queues whose items the calling thread is running, innermost first: a
/// linked list of records on the thread's stack, headed by a C thread-local
/// (`cshims_queue_frame`). A queue drained as an item of its target shows
/// both (the target's frame, then the queue's), so the list holds the whole
/// target chain of the item running now. Used for `WorkQueue.current`, for
/// `isCurrent` and for the deadlock checks of `sync` and `apply`, and by the
/// child after `fork()`, to learn what of its queues' state the forking
/// thread holds (`holding`).
struct QueueFrame {
    /// What the thread holds of the frame's queue while the frame's item
    /// runs: the one thing the queue's counts record for it.
    enum Holding: UInt8 {
        /// Nothing counted (a global queue's frame, an `apply` caller's).
        case nothing
        /// A running slot (or the barrier) claimed by `sync` on the
        /// caller's thread.
        case claim
        /// A drain slot, and the running slot (or barrier) of the item the
        /// drain runs now.
        case drain
    }

    /// The queue, unretained: whoever pushed the frame holds it.
    let queue: Unmanaged<WorkQueue>
    let previous: UnsafeMutableRawPointer?
    let holding: Holding

    /// Runs `body` with `queue` as the thread's innermost frame.
    @inline(__always)
    static func with<T, E: Error>(_ queue: WorkQueue, holding: Holding = .nothing, _ body: () throws(E) -> T) throws(E) -> T {
        try with(unretained: .passUnretained(queue), holding: holding, body)
    }

    /// `with`, for a queue the caller holds unretained (the caller keeps it
    /// alive; a pool worker's global queues live for the whole process).
    @inline(__always)
    static func with<T, E: Error>(
        unretained queue: Unmanaged<WorkQueue>, holding: Holding = .nothing, _ body: () throws(E) -> T
    ) throws(E) -> T {
        var frame = QueueFrame(queue: queue, previous: cshims_queue_frame(), holding: holding)
        return try withUnsafeMutablePointer(to: &frame) { (pointer) throws(E) -> T in
            cshims_set_queue_frame(UnsafeMutableRawPointer(pointer))
            defer { cshims_set_queue_frame(pointer.pointee.previous) }
            return try body()
        }
    }

    /// The innermost queue, or nil outside any item.
    static var innermost: WorkQueue? {
        guard let raw = cshims_queue_frame() else { return nil }
        return raw.assumingMemoryBound(to: QueueFrame.self).pointee.queue.takeUnretainedValue()
    }

    /// Whether the calling thread is running an item of `queue` (directly or
    /// as the target of the queue it drains).
    static func contains(_ queue: WorkQueue) -> Bool {
        var raw = cshims_queue_frame()
        while let r = raw {
            let frame = r.assumingMemoryBound(to: QueueFrame.self).pointee
            if frame.queue.toOpaque() == Unmanaged.passUnretained(queue).toOpaque() { return true }
            raw = frame.previous
        }
        return false
    }

    /// Every queue in the list, innermost first.
    static var all: [WorkQueue] {
        var queues: [WorkQueue] = []
        var raw = cshims_queue_frame()
        while let r = raw {
            let frame = r.assumingMemoryBound(to: QueueFrame.self).pointee
            queues.append(frame.queue.takeUnretainedValue())
            raw = frame.previous
        }
        return queues
    }

    /// In a child just forked, on its one thread: tells each queue whose
    /// item the forking thread runs what that thread holds of it (see
    /// `WorkQueue.noteForkingThreadHolding`). Pointer chasing and plain
    /// stores only: no allocation, no lock, no type metadata (see
    /// `ForkHandlers`).
    static func noteHoldingsAfterFork(epoch: UInt32) {
        var raw = cshims_queue_frame()
        while let r = raw {
            let frame = r.assumingMemoryBound(to: QueueFrame.self).pointee
            if frame.holding != .nothing {
                frame.queue._withUnsafeGuaranteedRef { $0.noteForkingThreadHolding(drain: frame.holding == .drain, epoch: epoch) }
            }
            raw = frame.previous
        }
    }
}
