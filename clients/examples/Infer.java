// The REST API from Java's own HTTP client (JDK 11 or later, no other library).
//
//   java clients/examples/Infer.java [HOST:PORT]      # default: $BATCHSERVE_HTTP or localhost:8000
//
// java.net.http.HttpClient speaks HTTP/2 by default, so on an http:// URL it offers to switch
// (Connection: Upgrade, Upgrade: h2c) with every request, POSTs included; batchserve declines
// and answers in HTTP/1.1, bodies read as usual. The second inference sends its tensor as
// binary data (Triton's binary tensor extension) in a chunked body, and asks for its output
// as binary data too: 10 little-endian float32 after the JSON header.
import java.io.ByteArrayInputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.stream.Collectors;

public class Infer {
    // One 8x8 image of a handwritten 0, pixel values 0-16 (scikit-learn's digits, image 0).
    static final float[] IMAGE = {
        0, 0, 5, 13, 9, 1, 0, 0,   0, 0, 13, 15, 10, 15, 5, 0,
        0, 3, 15, 2, 0, 11, 8, 0,  0, 4, 12, 0, 0, 8, 8, 0,
        0, 5, 8, 0, 0, 9, 8, 0,    0, 4, 11, 0, 1, 12, 7, 0,
        0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0,
    };

    public static void main(String[] args) throws Exception {
        String address = args.length > 0 ? args[0]
            : System.getenv().getOrDefault("BATCHSERVE_HTTP", "localhost:8000");
        String server = "http://" + address;
        HttpClient client = HttpClient.newHttpClient();

        System.out.println("# ready");
        System.out.println(send(client, HttpRequest.newBuilder(URI.create(server + "/v2/health/ready")).build()));

        System.out.println("# classify the image, as JSON");
        String data = Arrays.toString(IMAGE);
        String json = "{\"id\": \"java-example\", \"inputs\": [{\"name\": \"image\", \"datatype\": \"FP32\","
            + " \"shape\": [1, 1, 8, 8], \"data\": " + data + "}],"
            + " \"outputs\": [{\"name\": \"probabilities\"}]}";
        URI infer = URI.create(server + "/v2/models/digits_cnn/infer");
        System.out.println(send(client, HttpRequest.newBuilder(infer)
            .header("Content-Type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(json)).build()));

        System.out.println("# classify the image, as binary data in a chunked body");
        ByteBuffer pixels = ByteBuffer.allocate(IMAGE.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        for (float value : IMAGE) {
            pixels.putFloat(value);
        }
        byte[] header = ("{\"inputs\": [{\"name\": \"image\", \"datatype\": \"FP32\", \"shape\": [1, 1, 8, 8],"
            + " \"parameters\": {\"binary_data_size\": " + pixels.capacity() + "}}],"
            + " \"outputs\": [{\"name\": \"probabilities\", \"parameters\": {\"binary_data\": true}}]}")
            .getBytes(StandardCharsets.UTF_8);
        byte[] body = new byte[header.length + pixels.capacity()];
        System.arraycopy(header, 0, body, 0, header.length);
        System.arraycopy(pixels.array(), 0, body, header.length, pixels.capacity());
        HttpResponse<byte[]> answer = client.send(HttpRequest.newBuilder(infer)
            .header("Content-Type", "application/octet-stream")
            .header("Inference-Header-Content-Length", String.valueOf(header.length))
            // a stream of unknown length: sent chunked
            .POST(HttpRequest.BodyPublishers.ofInputStream(() -> new ByteArrayInputStream(body)))
            .build(), HttpResponse.BodyHandlers.ofByteArray());
        if (answer.statusCode() != 200) {
            throw new IllegalStateException(answer.statusCode() + " " + new String(answer.body(), StandardCharsets.UTF_8));
        }
        int jsonLength = Integer.parseInt(answer.headers().firstValue("Inference-Header-Content-Length").orElseThrow());
        ByteBuffer output = ByteBuffer.wrap(answer.body(), jsonLength, answer.body().length - jsonLength)
            .order(ByteOrder.LITTLE_ENDIAN);
        float[] probabilities = new float[output.remaining() / 4];
        int digit = 0;
        for (int i = 0; i < probabilities.length; i++) {
            probabilities[i] = output.getFloat();
            digit = probabilities[i] > probabilities[digit] ? i : digit;
        }
        System.out.printf("%s %s: digit %d (probability %.4f)%n", address, answer.version(), digit, probabilities[digit]);
    }

    /** The answer's body; an error status ends the example with the server's {"error": ...}. */
    static String send(HttpClient client, HttpRequest request) throws Exception {
        HttpResponse<String> response = client.send(request, HttpResponse.BodyHandlers.ofString());
        if (response.statusCode() != 200) {
            throw new IllegalStateException(response.statusCode() + " " + response.body());
        }
        return response.body();
    }
}
