// The gRPC API from Node.js with @grpc/grpc-js, a pure-JavaScript HTTP/2 client (not the
// C core that Python's grpcio, tritonclient and perf_analyzer share).
//
//   npm ci --prefix clients/examples/node
//   node clients/examples/node/infer.js [HOST:PORT]    # default: $BATCHSERVE_GRPC or localhost:8001
//
// It loads Triton's service definition from the server's sources, reads digits_cnn's inputs,
// classifies one image sent as raw bytes, sends 100 calls at once on one channel, and five
// requests down one ModelStreamInfer stream.
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const PROTOS = path.join(__dirname, '..', '..', '..', 'server', 'batchserve', 'proto');
// One 8x8 image of a handwritten 0, pixel values 0-16 (scikit-learn's digits, image 0).
const IMAGE = [
  0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0,
  0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
  0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0,
  0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0,
];

async function main() {
  const address = process.argv[2] || process.env.BATCHSERVE_GRPC || 'localhost:8001';
  const definition = loader.loadSync(path.join(PROTOS, 'grpc_service.proto'), {
    includeDirs: [PROTOS], keepCase: true, longs: String, defaults: true,
  });
  const { inference } = grpc.loadPackageDefinition(definition);
  const client = new inference.GRPCInferenceService(address, grpc.credentials.createInsecure());
  const call = (method, request) => new Promise((resolve, reject) => {
    client[method](request, (error, response) => (error ? reject(error) : resolve(response)));
  });

  console.log('# live');
  console.log((await call('ServerLive', {})).live);
  console.log('# the model\'s inputs');
  console.log(JSON.stringify((await call('ModelMetadata', { name: 'digits_cnn' })).inputs));

  const pixels = Buffer.alloc(IMAGE.length * 4);
  IMAGE.forEach((value, i) => pixels.writeFloatLE(value, i * 4));
  const request = {
    model_name: 'digits_cnn',
    inputs: [{ name: 'image', datatype: 'FP32', shape: [1, 1, 8, 8] }],
    outputs: [{ name: 'probabilities' }],
    raw_input_contents: [pixels],
  };
  console.log('# classify the image');
  const answer = await call('ModelInfer', request);
  const raw = answer.raw_output_contents[0];
  const probabilities = Array.from({ length: raw.length / 4 }, (_, i) => raw.readFloatLE(i * 4));
  const digit = probabilities.indexOf(Math.max(...probabilities));
  console.log(`${address} grpc-js: digit ${digit} (probability ${probabilities[digit].toFixed(4)})`);

  console.log('# 100 calls at once on one channel');
  const outcomes = await Promise.all(Array.from({ length: 100 }, () => call('ModelInfer', request)
    .then(() => 'ok', (error) => `code ${error.code}`)));
  console.log(`${outcomes.filter((o) => o === 'ok').length} answered`);

  console.log('# five requests down one stream');
  const stream = client.ModelStreamInfer();
  const ids = [];
  stream.on('data', (response) => {
    if (response.error_message) throw new Error(response.error_message);
    ids.push(response.infer_response.id);
  });
  const ended = new Promise((resolve, reject) => { stream.on('end', resolve); stream.on('error', reject); });
  for (let i = 0; i < 5; i++) stream.write({ ...request, id: String(i) });
  stream.end();
  await ended;
  console.log(`answers to requests ${JSON.stringify(ids.sort())}`);
  client.close();
}

main().catch((error) => { console.error(error); process.exit(1); });
