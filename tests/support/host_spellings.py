"""Other spellings of addresses, as resolvers and HTTP clients read them: the table the
host parser's tests and the API's tests share. Each is (URL, the canonical address a
refusal names); every one reaches that address through getaddrinfo/inet_aton or an
IPv6 socket."""

from __future__ import annotations

from hypothesis import strategies as st

# URL-shaped texts for property tests: any text after http://, and URLs made of every
# character a URL's authority can hold
URL_TEXTS = st.one_of(
    st.text(max_size=40).map(lambda t: "http://" + t),
    st.from_regex(r"\Ahttps?://[a-zA-Z0-9.:@/?#%\[\]_~!$&'()*+,;=\\-]{0,40}\Z"),
)

OTHER_SPELLINGS: list[tuple[str, str]] = [
    ("http://2852039166/", "169.254.169.254"),
    ("http://0xa9fea9fe/", "169.254.169.254"),
    ("http://0XA9FEA9FE/", "169.254.169.254"),
    ("http://169.254.43518/", "169.254.169.254"),
    ("http://169.16689662/", "169.254.169.254"),
    ("http://169.0xfe.169.254/", "169.254.169.254"),
    ("http://0251.0376.0251.0376/", "169.254.169.254"),
    ("http://0xA9.0xFE.0xA9.0xFE/", "169.254.169.254"),
    ("http://169.254.169.254./", "169.254.169.254"),
    ("http://169.254.169.0254/", "169.254.169.172"),
    ("http://[::ffff:169.254.169.254]/", "169.254.169.254"),
    ("http://[::ffff:a9fe:a9fe]/", "169.254.169.254"),
    ("http://[::FFFF:A9FE:A9FE]/", "169.254.169.254"),
    ("http://[0:0:0:0:0:ffff:169.254.169.254]/", "169.254.169.254"),
    ("http://[::169.254.169.254]/", "169.254.169.254"),
    ("http://2130706433/", "127.0.0.1"),
    ("http://0x7f000001/", "127.0.0.1"),
    ("http://127.1/", "127.0.0.1"),
    ("http://0177.0.0.1/", "127.0.0.1"),
    ("http://[::ffff:127.0.0.1]/", "127.0.0.1"),
    ("http://0/", "0.0.0.0"),
    ("http://0x0/", "0.0.0.0"),
    ("http://010.0.0.1:8080/", "8.0.0.1"),
]

# link-local or metadata however written: refused by the guard, not for their spelling
METADATA_URLS: list[str] = [
    "http://169.254.169.254/",
    "http://[fe80::1]/",
    "http://[fd00:ec2::254]/",
    "http://100.100.100.200/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 to 169.254.169.254
    "http://[64:ff9b::169.254.169.254]/",
    "http://[64:ff9b:1::a9fe:a9fe]/",  # NAT64, local-use prefix
    "http://[::ffff:0:a9fe:a9fe]/",  # SIIT's IPv4-translated form
    "http://[2002:a9fe:a9fe::1]/",  # 6to4 through 169.254.169.254
    "http://metadata.google.internal./",
]

# refused: no resolver reads them as one thing (URL, what the refusal says)
NOT_HOSTS: list[tuple[str, str]] = [
    ("http://[fe80::1%25eth0]/", "zone id"),
    ("http://[::ffff:a9fe:a9fe%25eth0]/", "zone id"),
    ("http://%31%36%39.254.169.254/", "percent-encoded"),
    ("http://1.2.3.256/", "not an IPv4 address"),
    ("http://1.2.3.4.5/", "not an IPv4 address"),
    ("http://services.123/", "not an IPv4 address"),
    ("http://08.0.0.1/", "not an IPv4 address"),  # 8 is no octal digit
    ("http://1.2..3/", "not an IPv4 address"),
    ("http://payments..internal/", "valid name"),
    ("http://\uff11\uff16\uff19.254.169.254/", "ASCII"),  # IDNA 2003 maps these to digits
    ("http://b\u00fccher.example/", "xn--"),
    ("http://pay$ments/", "valid name"),
    ("http://-payments/", "valid name"),
]
