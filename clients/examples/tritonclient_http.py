"""Classify a handwritten digit with NVIDIA's tritonclient over HTTP (binary tensors).

    pip install 'tritonclient[http]' numpy
    python clients/examples/tritonclient_http.py [HOST:PORT]

The server's address comes from the argument, else $BATCHSERVE_HTTP, else localhost:8000.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tritonclient.http as httpclient

# One 8x8 image of a handwritten 0, pixel values 0-16 (scikit-learn's digits, image 0).
IMAGE = np.array(
    [[0, 0, 5, 13, 9, 1, 0, 0], [0, 0, 13, 15, 10, 15, 5, 0],
     [0, 3, 15, 2, 0, 11, 8, 0], [0, 4, 12, 0, 0, 8, 8, 0],
     [0, 5, 8, 0, 0, 9, 8, 0], [0, 4, 11, 0, 1, 12, 7, 0],
     [0, 2, 14, 5, 10, 12, 0, 0], [0, 0, 6, 13, 10, 0, 0, 0]],
    dtype=np.float32,
).reshape(1, 1, 8, 8)  # fmt: skip


def main() -> None:
    address = os.environ.get("BATCHSERVE_HTTP", "localhost:8000")
    address = sys.argv[1] if len(sys.argv) > 1 else address
    client = httpclient.InferenceServerClient(address)
    try:
        image = httpclient.InferInput("image", list(IMAGE.shape), "FP32")
        image.set_data_from_numpy(IMAGE, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("probabilities", binary_data=True)]
        result = client.infer("digits_cnn", [image], outputs=wanted)
    finally:
        client.close()
    probabilities = result.as_numpy("probabilities")[0]
    digit = int(probabilities.argmax())
    print(f"digit {digit} (probability {probabilities[digit]:.4f})")


if __name__ == "__main__":
    main()
