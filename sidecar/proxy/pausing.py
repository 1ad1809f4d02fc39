"""Why reading from a client connection is paused: a bit each in
`ClientConnection.read_block`; reading resumes when none is left.

Final module-level ints, so the exchange, the client protocol and the server test and
set them without a lookup through another object (compiled, as constants).
"""

from typing import Final

UPSTREAM_FULL: Final = 1  # the upstream's write buffer is above its high-water mark
WAIT_UPSTREAM: Final = 2  # body bytes arrive while no upstream connection is ready
PIPELINED: Final = 4  # a pipelined request waits for the one before it
STOPPED: Final = 8  # nothing more will be read (upgrade requested, parse error)
UPGRADING: Final = 16  # an upgrade awaits the upstream's answer: what follows is not HTTP yet
