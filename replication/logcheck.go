package replication

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// checkedLogs is a raft.LogStore that stores a CRC-32C of every entry with
// it and checks it on every read: bbolt checks its pages' structure but not
// the bytes of a value, so a flipped bit in an entry's data would otherwise
// be applied as a different push, and the replica would drift from its
// peers without anyone knowing.
//
// The checksum rides in the stored entry's Extensions (hashicorp/raft
// leaves that field to middleware and never reads it), as a marker and
// the CRC of (index, term, type, data). Entries read back lose it again, so
// it never reaches the FSM or another node. Entries written before
// checksums existed have no marker and are read unchecked.
//
// A read that fails the check answers raft.ErrLogNotFound: raft then sends
// a lagging follower a snapshot instead of the entry (replicateTo), and at
// open NewRaft's scan of the entries after the snapshot panics on it, which
// OpenRaft contains and reports as ErrCorruptReplica.
//
// Concurrency: as the wrapped store's; the struct itself is immutable.
type checkedLogs struct {
	raft.LogStore
	what string
	log  hclog.Logger
}

// logCRCMarker starts the Extensions of a checksummed entry.
var logCRCMarker = []byte("rpsC")

var crc32c = crc32.MakeTable(crc32.Castagnoli)

func logCRC(l *raft.Log) uint32 {
	var h [17]byte
	binary.LittleEndian.PutUint64(h[0:], l.Index)
	binary.LittleEndian.PutUint64(h[8:], l.Term)
	h[16] = byte(l.Type)
	return crc32.Update(crc32.Checksum(h[:], crc32c), crc32c, l.Data)
}

func (c checkedLogs) GetLog(index uint64, l *raft.Log) error {
	if err := c.LogStore.GetLog(index, l); err != nil {
		return err
	}
	ext := l.Extensions
	if !bytes.HasPrefix(ext, logCRCMarker) {
		return nil
	}
	if len(ext) != len(logCRCMarker)+4 || binary.LittleEndian.Uint32(ext[len(logCRCMarker):]) != logCRC(l) || l.Index != index {
		c.log.Error("raft log entry fails its checksum; answering as if it were missing", "log", c.what, "index", index, "error", ErrCorruptReplica)
		return raft.ErrLogNotFound
	}
	l.Extensions = nil
	return nil
}

func (c checkedLogs) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores copies of logs with their checksums: the callers' entries
// are the ones raft keeps in its cache and sends to followers.
func (c checkedLogs) StoreLogs(logs []*raft.Log) error {
	out := make([]*raft.Log, len(logs))
	vals := make([]raft.Log, len(logs))
	for i, l := range logs {
		if len(l.Extensions) > 0 {
			return fmt.Errorf("%s: entry %d carries extensions, which the checksum would overwrite", c.what, l.Index)
		}
		vals[i] = *l
		vals[i].Extensions = binary.LittleEndian.AppendUint32(append([]byte(nil), logCRCMarker...), logCRC(l))
		out[i] = &vals[i]
	}
	return c.LogStore.StoreLogs(out)
}
