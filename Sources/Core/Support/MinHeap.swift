/// An element of a `MinHeap`: `isBefore` is a strict order (deadlines, then
/// submission order, for the timer heaps). `placed(at:)` hears of every
/// move, for elements that must be found again to be removed (default:
/// nothing).
protocol HeapOrdered {
    func isBefore(_ other: Self) -> Bool
    /// The element now sits at `index` (or -1: it left the heap).
    func placed(at index: Int)
}

extension HeapOrdered {
    func placed(at index: Int) {}
}

/// A binary min-heap in an array: O(log n) push, pop of the first element
/// and removal at a known index. Spindle's timer structure uses it: the pool
/// poller's `TimerQueue`, which holds queue timer sources and
/// `async(after:)` alike. Not thread-safe; its owner guards it.
struct MinHeap<Element: HeapOrdered> {
    private var elements: [Element] = []

    var first: Element? { elements.first }
    var isEmpty: Bool { elements.isEmpty }
    var count: Int { elements.count }

    mutating func push(_ element: Element) {
        elements.append(element)
        siftUp(elements.count - 1)
    }

    /// Removes and returns the first element. The heap must not be empty.
    mutating func popFirst() -> Element {
        remove(at: 0)
    }

    /// Removes and returns the element at `index` (as last told by
    /// `placed(at:)`). `index` must be in the heap.
    mutating func remove(at index: Int) -> Element {
        let removed = elements[index]
        let last = elements.removeLast()
        removed.placed(at: -1)
        guard index < elements.count else { return removed }
        elements[index] = last
        last.placed(at: index)
        if index > 0 && last.isBefore(elements[(index - 1) / 2]) {
            siftUp(index)
        } else {
            siftDown(index)
        }
        return removed
    }

    /// Keeps only the elements for which `keep` is true, in heap order again.
    mutating func keepOnly(_ keep: (Element) -> Bool) {
        let kept = elements.filter(keep)
        for element in elements { element.placed(at: -1) }
        elements.removeAll(keepingCapacity: true)
        for element in kept { push(element) }
    }

    mutating func removeAll() {
        for element in elements { element.placed(at: -1) }
        elements.removeAll()
    }

    private mutating func siftUp(_ start: Int) {
        var i = start
        while i > 0 {
            let parent = (i - 1) / 2
            guard elements[i].isBefore(elements[parent]) else { break }
            elements.swapAt(i, parent)
            elements[i].placed(at: i)
            i = parent
        }
        elements[i].placed(at: i)
    }

    private mutating func siftDown(_ start: Int) {
        var i = start
        while true {
            let left = 2 * i + 1, right = left + 1
            var smallest = i
            if left < elements.count && elements[left].isBefore(elements[smallest]) { smallest = left }
            if right < elements.count && elements[right].isBefore(elements[smallest]) { smallest = right }
            if smallest == i { break }
            elements.swapAt(i, smallest)
            elements[i].placed(at: i)
            i = smallest
        }
        elements[i].placed(at: i)
    }
}
