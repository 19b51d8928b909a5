import CShims

/// The watch of a file-system object source. One inotify instance serves
/// the sources on work queues (waited for in the pool's poller, whose
/// worker runs their calls), another the sources on loops (waited for on
/// the reactor thread: a loop cannot wait for a process-wide instance
/// itself); each source's descriptor is watched
/// through `/proc/self/fd/N`, so the watch is on the inode and follows the
/// file through renames. Sources on the same file share the kernel watch
/// (inotify gives one watch descriptor per inode); the watch goes when the
/// last of them is cancelled.
///
/// inotify's events become `FileEvents` with the help of `fstat` on the
/// source's descriptor: an extension is a modification that grew the size;
/// a link change is an attribute change that changed the link count; a
/// deletion is the link count reaching 0 (inotify sends `IN_DELETE_SELF`
/// only after the last descriptor closes, and the source's is open). On a
/// directory, inotify's events for its entries (`IN_CREATE`, `IN_DELETE`,
/// `IN_MOVED_FROM`, `IN_MOVED_TO`) are a write of the directory, as a kqueue
/// vnode source reports them; a directory's size is not an extension. The
/// events inotify sends a directory watch about what happens inside its
/// entries (a file in it written or chmodded: `IN_MODIFY`, `IN_ATTRIB` with
/// the entry's name) are not the directory's, and are dropped.
final class FileSystemWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `home` and `stopped` are guarded by `lock`; the rest of
    // what is mutable by the registries' locks (taken inside `lock`, never
    // the other way round; both registries' during a move, one at a time).

    let descriptor: Int32
    let events: EventSource.FileEvents
    /// Whether the object is a directory (its entries' changes are writes).
    let isDirectory: Bool
    /// Whether the source asked for an event that only the object's size
    /// or link count tells (extend, link, delete while open); a source
    /// that did not makes no `fstat` per event.
    private let needsStat: Bool
    /// The size and link count last seen, under `seenLock` (a leaf lock:
    /// while the watch moves, both registries may translate events for it).
    private var size: Int64
    private var links: UInt64
    private let seenLock = GuardLock()
    fileprivate weak var source: EventSource?
    private let lock = GuardLock()
    /// The registry the watch is in, if any.
    private var home: Registry?
    /// Set by `stop`: a `start` or `move` that comes after it (a cancel
    /// racing the activation) registers nothing.
    private var stopped = false

    init(descriptor: Int32, events: EventSource.FileEvents) throws(EventSourceError) {
        require(descriptor >= 0, "EventSource.fileSystemObject: `descriptor` is \(descriptor); it must be an open descriptor")
        let stat = try EventSourceCalls.stat(descriptor)
        self.descriptor = descriptor
        self.events = events
        isDirectory = stat.type == EventSourceCalls.directory
        needsStat = !events.isDisjoint(with: [.extend, .link, .delete])
        size = stat.size
        links = stat.links
    }

    var waitsOnTheReactorForLoops: Bool { true }

    /// The inotify events that can produce `events`.
    var inotifyMask: UInt32 {
        var mask: UInt32 = 0
        if !events.isDisjoint(with: [.write, .extend]) { mask |= CSHIMS_IN_MODIFY }
        if isDirectory && !events.isDisjoint(with: [.write, .link]) { mask |= Self.entryChanges }
        if !events.isDisjoint(with: [.attributes, .link, .delete]) { mask |= CSHIMS_IN_ATTRIB | CSHIMS_IN_DELETE_SELF }
        if events.contains(.rename) { mask |= CSHIMS_IN_MOVE_SELF }
        return mask
    }

    /// A directory's entry events: one made, removed, or renamed out or in.
    private static let entryChanges = CSHIMS_IN_CREATE | CSHIMS_IN_DELETE | CSHIMS_IN_MOVED_FROM | CSHIMS_IN_MOVED_TO

    func start(for source: EventSource, at placement: WatchPlacement) {
        enter(Registry.at(placement), for: source, moving: false)
    }

    /// Moves the watch between the pool's inotify instance and the
    /// reactor's, joining the new one before it leaves the old one: an
    /// event in between is queued in both instances (merged into the source
    /// twice at worst: the data is or-ed), and what the old instance has
    /// queued but not yet delivered is read and delivered as it is left. So
    /// no change is lost to the move.
    func move(for source: EventSource, to placement: WatchPlacement) {
        enter(Registry.at(placement), for: source, moving: true)
    }

    /// Runs between joining the new registry and leaving the old one in a
    /// move (tests: a change made there must be delivered).
    static let moveProbe = LockedValue<(@Sendable () -> Void)?>(nil)

    private func enter(_ next: Registry, for source: EventSource, moving: Bool) {
        let failure: EventSourceError? = lock.withLock {
            guard !stopped, home !== next, moving == (home != nil) else { return nil }
            do throws(EventSourceError) {
                try next.add(self, for: source)
            } catch {
                // Still watched where it was; the failure cancels the source.
                return error
            }
            if let previous = home {
                if let probe = Self.moveProbe.withLock({ $0 }) { probe() }
                previous.remove(self, deliveringPending: true)
            }
            home = next
            return nil
        }
        // Outside the lock: failing cancels, and cancelling stops.
        if let failure { source.fail(failure) }
    }

    var placementName: String? {
        lock.withLock { home.map { $0 === Registry.pool ? "pool" : "reactor" } }
    }

    func stop() {
        lock.withLock {
            stopped = true
            home?.remove(self)
            home = nil
        }
    }

    /// The `FileEvents` that `mask` (from inotify) means for this watch,
    /// with the size and link count it last saw brought up to date. Under
    /// a registry's lock.
    fileprivate func translate(_ mask: UInt32) -> EventSource.FileEvents {
        var found: EventSource.FileEvents = []
        if mask & CSHIMS_IN_ENTRY != 0 {
            // About an entry of this directory: a change of the directory
            // only if the entry was made, removed or renamed; a write to a
            // file in it (or its chmod) is the file's, not the directory's.
            guard mask & Self.entryChanges != 0 else { return [] }
            found.insert(.write)
        }
        // Only a source that asked for what only `fstat` tells looks.
        let stat = needsStat ? try? EventSourceCalls.stat(descriptor) : nil
        if mask & CSHIMS_IN_ENTRY == 0 {
            if mask & CSHIMS_IN_MODIFY != 0 { found.insert(.write) }
            if mask & CSHIMS_IN_ATTRIB != 0 { found.insert(.attributes) }
            if mask & CSHIMS_IN_MOVE_SELF != 0 { found.insert(.rename) }
            if mask & CSHIMS_IN_DELETE_SELF != 0 { found.insert(.delete) }
            if mask & CSHIMS_IN_UNMOUNT != 0 { found.insert(.revoke) }
        }
        if let stat {
            seenLock.withLock {
                if stat.size > size && !isDirectory { found.insert(.extend) }
                if stat.links != links { found.insert(.link) }
                if stat.links == 0 { found.insert(.delete) }
                size = stat.size
                links = stat.links
            }
        }
        return found.intersection(events)
    }

    /// The file-system object sources of the process that wait in one
    /// place, with their inotify instance: the pool's poller (`pool`) or
    /// the reactor thread (`reactor`).
    final class Registry: @unchecked Sendable {
        // @unchecked: everything is guarded by `lock`.

        /// Sources on work queues: their instance waits in the pool's poller.
        static let pool = Registry(onPool: true)
        /// Sources on loops: their instance waits on the reactor thread.
        static let reactor = Registry(onPool: false)

        /// The registry for a watch placed at `placement`.
        static func at(_ placement: WatchPlacement) -> Registry {
            if case .pool = placement { return pool }
            return reactor
        }

        private let onPool: Bool
        private let lock = GuardLock()
        private var inotify = ProcessWideDescriptor()
        private var byWatch: [Int32: [FileSystemWatch]] = [:]
        /// Each registered watch's inotify watch descriptor in this
        /// registry's instance (a watch is in both registries for a moment
        /// while it moves, with a number in each).
        private var wdOf: [ObjectIdentifier: Int32] = [:]
        private var wds = [Int32](repeating: 0, count: 256)
        private var masks = [UInt32](repeating: 0, count: 256)

        private init(onPool: Bool) { self.onPool = onPool }

        /// Where this registry's instance is watched; starts the reactor for
        /// the reactor's registry (which may throw).
        private func home() throws(EventSourceError) -> ProcessWideHome {
            if onPool, let poller = WorkerPool.standard.poller { return .pool(poller) }
            return .loop(try EventReactor.loop())
        }

        func add(_ watch: FileSystemWatch, for source: EventSource) throws(EventSourceError) {
            // Before the lock: starting the reactor takes the reactor's
            // lock, which is never taken inside this one.
            let home = try home()
            lock.lock()
            defer { lock.unlock() }
            let fd = try inotify.watch(at: home, EventSourceCalls.inotify) { [unowned self] in self.deliver() }
            let wd: Int32
            do throws(EventSourceError) {
                wd = try EventSourceCalls.inotifyWatch(fd, descriptor: watch.descriptor, mask: watch.inotifyMask)
            } catch {
                if byWatch.isEmpty { inotify.unwatch() }
                throw error
            }
            // Unchanged by a move (the other registry may be reading it).
            if watch.source !== source { watch.source = source }
            wdOf[ObjectIdentifier(watch)] = wd
            byWatch[wd, default: []].append(watch)
        }

        /// Ends `watch`'s registration here. `deliveringPending` (a move):
        /// first reads what the instance has queued and delivers it, so
        /// that a change reported here but not yet read is not lost with
        /// the registration (the sources of other watches get theirs now
        /// too, a little early).
        func remove(_ watch: FileSystemWatch, deliveringPending: Bool = false) {
            var due: [(EventSource, EventSource.FileEvents)] = []
            lock.withLock {
                if deliveringPending && inotify.fd >= 0 { collect(into: &due) }
                // Nothing left to wait for here: the poller may go unheld.
                defer { if byWatch.isEmpty { inotify.unwatch() } }
                guard let wd = wdOf.removeValue(forKey: ObjectIdentifier(watch)),
                      var list = byWatch[wd]
                else { return }
                list.removeAll { $0 === watch }
                if list.isEmpty {
                    byWatch[wd] = nil
                    EventSourceCalls.inotifyUnwatch(inotify.fd, wd)
                } else {
                    byWatch[wd] = list
                }
            }
            for (source, found) in due { source.or(found.rawValue) }
        }

        /// Where the instance waits, when it is readable.
        private func deliver() {
            var due: [(EventSource, EventSource.FileEvents)] = []
            lock.withLock { collect(into: &due) }
            for (source, found) in due { source.or(found.rawValue) }
        }

        /// Under the lock: reads every event the instance has queued and
        /// appends what each source is due (merged by the caller, outside
        /// the lock).
        private func collect(into due: inout [(EventSource, EventSource.FileEvents)]) {
            // Until a read takes all there is: a read that leaves room for
            // the longest event took everything queued (an event queued
            // after it makes the instance readable again, and its watch is
            // re-armed after this delivery), so no read is made only to
            // find the queue empty.
            var more = true
            while more {
                let (n, left) = EventSourceCalls.inotifyRead(inotify.fd, &wds, &masks)
                more = left
                if n == 0 { break }
                for i in 0..<n {
                    guard let list = byWatch[wds[i]] else { continue }
                    for watch in list {
                        let found = watch.translate(masks[i])
                        if !found.isEmpty, let source = watch.source { due.append((source, found)) }
                    }
                    if masks[i] & CSHIMS_IN_IGNORED != 0 {
                        // The kernel dropped the watch (deleted, unmounted):
                        // its number may be given to another file now.
                        for watch in list { wdOf[ObjectIdentifier(watch)] = nil }
                        byWatch[wds[i]] = nil
                    }
                }
            }
        }

        func childAfterFork() {
            lock.reinitializeAfterFork()
            inotify.childAfterFork()
            byWatch = [:]
            wdOf = [:]
        }
    }
}
