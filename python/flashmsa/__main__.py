"""`python -m flashmsa`: version, build options and the backends this machine can use."""

import flashmsa

print(f"flashmsa {flashmsa.__version__}")
print(flashmsa.build_info())
for name, status in flashmsa.backends():
    print(f"backend {name:10s} {status}")
