//! A screen grab made into what the model sees: 32-bit pixels to packed RGB, scaled down with a
//! box filter (text stays legible at half size), encoded as PNG.

use sandbox_mcp_protocol::{AgentError, ErrorKind};

use super::error;

/// 32-bit pixels (B, G, R, pad when little-endian) to packed RGB.
pub(crate) fn to_rgb(pixels: &[u8], lsb: bool) -> Vec<u8> {
    let mut rgb = Vec::with_capacity(pixels.len() / 4 * 3);
    for p in pixels.chunks_exact(4) {
        if lsb {
            rgb.extend_from_slice(&[p[2], p[1], p[0]]);
        } else {
            rgb.extend_from_slice(&[p[1], p[2], p[3]]);
        }
    }
    rgb
}

/// The size of a `w`×`h` screen scaled by `scale` (at least one pixel each way).
pub(crate) fn scaled(w: usize, h: usize, scale: f64) -> (usize, usize) {
    let s = |n: usize| ((n as f64 * scale).round() as usize).clamp(1, n);
    (s(w), s(h))
}

/// Box filter: each output pixel is the mean of the input pixels it covers (text stays legible
/// at half size, where dropping pixels would break strokes).
pub(crate) fn downscale(rgb: &[u8], w: usize, h: usize, dw: usize, dh: usize) -> Vec<u8> {
    if (w, h) == (dw * 2, dh * 2) {
        return halve(rgb, w, dw, dh);
    }
    let mut out = Vec::with_capacity(dw * dh * 3);
    for dy in 0..dh {
        let (y0, y1) = (dy * h / dh, ((dy + 1) * h / dh).max(dy * h / dh + 1));
        for dx in 0..dw {
            let (x0, x1) = (dx * w / dw, ((dx + 1) * w / dw).max(dx * w / dw + 1));
            let mut sum = [0u32; 3];
            for y in y0..y1 {
                for x in x0..x1 {
                    let at = (y * w + x) * 3;
                    for (i, s) in sum.iter_mut().enumerate() {
                        *s += u32::from(rgb[at + i]);
                    }
                }
            }
            let n = ((y1 - y0) * (x1 - x0)) as u32;
            out.extend(sum.map(|s| (s / n) as u8));
        }
    }
    out
}

/// [`downscale`] by exactly two each way (scale 0.5, the common case): each output pixel is the
/// mean of a 2×2 block, without the general loop's bookkeeping.
fn halve(rgb: &[u8], w: usize, dw: usize, dh: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(dw * dh * 3);
    for dy in 0..dh {
        let top = &rgb[(2 * dy) * w * 3..(2 * dy + 1) * w * 3];
        let bottom = &rgb[(2 * dy + 1) * w * 3..(2 * dy + 2) * w * 3];
        for (a, b) in top.chunks_exact(6).zip(bottom.chunks_exact(6)) {
            for i in 0..3 {
                let sum =
                    u16::from(a[i]) + u16::from(a[i + 3]) + u16::from(b[i]) + u16::from(b[i + 3]);
                out.push((sum / 4) as u8);
            }
        }
    }
    out
}

pub(crate) fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, AgentError> {
    let mut out = Vec::with_capacity(rgb.len() / 8);
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    let png_error = |e: png::EncodingError| error(ErrorKind::Io, format!("cannot encode PNG: {e}"));
    let mut writer = encoder.write_header().map_err(png_error)?;
    writer.write_image_data(rgb).map_err(png_error)?;
    writer.finish().map_err(png_error)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_at_least_a_pixel_and_never_grows() {
        assert_eq!(scaled(1280, 800, 0.5), (640, 400));
        assert_eq!(scaled(1280, 800, 1.0), (1280, 800));
        assert_eq!(scaled(1280, 800, 0.0001), (1, 1));
        assert_eq!(scaled(1280, 800, 3.0), (1280, 800));
    }

    #[test]
    fn downscaling_averages_what_each_pixel_covers() {
        // 2x2 → 1x1: the mean of four pixels.
        let rgb = [0, 0, 0, 255, 255, 255, 100, 0, 0, 0, 0, 100];
        assert_eq!(downscale(&rgb, 2, 2, 1, 1), vec![88, 63, 88]);
        // 3x1 → 2x1: boxes of one and two pixels.
        let rgb = [10, 10, 10, 20, 20, 20, 40, 40, 40];
        assert_eq!(downscale(&rgb, 3, 1, 2, 1), vec![10, 10, 10, 30, 30, 30]);
    }

    #[test]
    fn halving_matches_the_general_box_filter() {
        let (w, h) = (64, 40);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 256) as u8).collect();
        assert_eq!(halve(&rgb, w, w / 2, h / 2), {
            // The general loop, bypassing the fast path.
            let (dw, dh) = (w / 2, h / 2);
            let mut out = Vec::new();
            for dy in 0..dh {
                for dx in 0..dw {
                    for i in 0..3 {
                        let px = |x: usize, y: usize| u32::from(rgb[(y * w + x) * 3 + i]);
                        let sum = px(2 * dx, 2 * dy)
                            + px(2 * dx + 1, 2 * dy)
                            + px(2 * dx, 2 * dy + 1)
                            + px(2 * dx + 1, 2 * dy + 1);
                        out.push((sum / 4) as u8);
                    }
                }
            }
            out
        });
    }

    #[test]
    fn pixels_become_rgb_in_either_byte_order() {
        assert_eq!(to_rgb(&[1, 2, 3, 0], true), vec![3, 2, 1]);
        assert_eq!(to_rgb(&[0, 1, 2, 3], false), vec![1, 2, 3]);
    }

    #[test]
    fn png_encodes_and_decodes_back() {
        let rgb: Vec<u8> = (0..(64 * 48 * 3)).map(|i| (i % 251) as u8).collect();
        let png = encode_png(&rgb, 64, 48).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (64, 48));
        assert_eq!(&buf[..info.buffer_size()], &rgb[..]);
    }
}
