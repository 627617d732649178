"""`python -m flashmsa`: version, build options and the backends this machine can use, in the
words of `flashmsa info`."""

import flashmsa

print(flashmsa.build_info())  # its first line is "flashmsa <version>"
for name, status in flashmsa.backends():
    print(f"backend {name:10s} {status if status == 'available' else 'unavailable: ' + status}")
