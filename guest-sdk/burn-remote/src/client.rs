//! burn-router's client for the wtune host: operations are queued in guest
//! memory and sent in frames.

use std::future::ready;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use burn_backend::{DType, DTypeUsage, DTypeUsageSet, ExecutionError, Shape, TensorData};
use burn_ir::{GraphBindings, GraphId, OperationIr, TensorId, TensorIr};
use burn_router::{MultiBackendBridge, RouterChannel, RouterClient, RouterTensor};
use burn_std::future::DynFut;

use crate::RemoteDevice;
use crate::transport::{Transport, installed};
use crate::wire::{Command, Frame};

/// A frame goes to the host once it holds this many commands: enough that
/// the crossing costs little per operation, few enough that the host is
/// kept busy while the guest records more.
const FRAME_COMMANDS: usize = 256;
/// ... or this many bytes (tensor data the guest made).
const FRAME_BYTES: usize = 1 << 20;

/// Commands not yet handed to the host.
static QUEUE: Mutex<Frame> = Mutex::new(Frame::new());

/// Tensor ids, unique for the guest's lifetime. They live in guest memory,
/// so a snapshot restores them with the host's tensors they name.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Why burn-router's graph calls never come: they are its `fusion` feature's.
const FUSION_ONLY: &str = "burn-router records graphs only with its `fusion` feature, which is off";

const NO_TRANSPORT: &str = "burn's remote device sends tensor operations to the wtune host, \
     and none is connected: run this guest under wtune, or install a burn_remote::Transport";

fn transport() -> Result<&'static dyn Transport, ExecutionError> {
    installed().ok_or_else(|| ExecutionError::generic(NO_TRANSPORT))
}

/// Queues `command`, handing the queue to the host when it is full.
fn queue(command: Command) {
    let mut frame = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    frame.push(&command);
    if frame.len() >= FRAME_COMMANDS || frame.bytes().len() >= FRAME_BYTES {
        submit(&mut frame);
    }
}

/// Hands `frame` to the host. Without a transport the commands are
/// dropped: the next read or sync says why.
fn submit(frame: &mut Frame) {
    if frame.is_empty() {
        return;
    }
    if let Ok(transport) = transport() {
        transport.submit(frame.bytes());
    }
    frame.clear();
}

/// Sends what is queued along with a call that waits for the host.
fn with_queue<T>(
    call: impl FnOnce(&dyn Transport, &[u8]) -> Result<T, ExecutionError>,
) -> Result<T, ExecutionError> {
    let mut frame = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    let result = transport().and_then(|transport| call(transport, frame.bytes()));
    frame.clear();
    result
}

/// Sends a guest's tensor operations to the wtune host.
#[derive(Clone, Copy, Default, Debug)]
pub struct WtuneClient;

impl RouterClient for WtuneClient {
    type Device = RemoteDevice;

    fn register_op(&self, op: OperationIr) {
        queue(Command::Operation(op));
    }

    fn read_tensor_async(&self, tensor: TensorIr) -> DynFut<Result<TensorData, ExecutionError>> {
        // The host answers synchronously: a guest has no executor, and
        // burn's wasm `block_on` polls a future once.
        Box::pin(ready(with_queue(|transport, frame| {
            transport.read(frame, tensor)
        })))
    }

    fn sync(&self) -> Result<(), ExecutionError> {
        with_queue(|transport, frame| transport.sync(frame))
    }

    fn flush(&self) {
        submit(&mut QUEUE.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn create_empty_handle(&self) -> TensorId {
        TensorId::new(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }

    fn register_tensor_data(&self, data: TensorData) -> RouterTensor<Self> {
        let id = self.create_empty_handle();
        let (shape, dtype) = (data.shape().clone(), data.dtype());
        queue(Command::Data { id, data });
        RouterTensor::new(id, shape, dtype, *self)
    }

    fn device(&self) -> RemoteDevice {
        RemoteDevice
    }

    fn seed(&self, seed: u64) {
        queue(Command::Seed(seed));
    }

    /// What the host's backends support: every float and integer type,
    /// stored and computed with; bools as the host's backend stores them
    /// ([`Transport::bools`]); no quantized tensors.
    fn dtype_usage(&self, dtype: DType) -> DTypeUsageSet {
        match dtype {
            DType::QFloat(_) => DTypeUsageSet::empty(),
            DType::Bool(store) if store != crate::transport::bools() => DTypeUsageSet::empty(),
            _ => DTypeUsage::Storage | DTypeUsage::Arithmetic,
        }
    }

    fn register_and_execute_graph(&self, _: GraphId, _: Vec<OperationIr>, _: GraphBindings) {
        unreachable!("{FUSION_ONLY}")
    }

    fn execute_graph(&self, _: GraphId, _: GraphBindings) {
        unreachable!("{FUSION_ONLY}")
    }

    fn register_alias(&self, _: TensorId, _: TensorId) {
        unreachable!("{FUSION_ONLY}")
    }
}

/// burn-router's channel to the wtune host: one device, one client.
#[derive(Clone)]
pub struct WtuneChannel;

impl RouterChannel for WtuneChannel {
    type Device = RemoteDevice;
    type Bridge = NoBridge;
    type Client = WtuneClient;

    fn name(_: &RemoteDevice) -> String {
        "wtune-host".into()
    }

    fn init_client(_: &RemoteDevice) -> WtuneClient {
        WtuneClient
    }

    fn get_tensor_handle(_: &TensorIr, _: &WtuneClient) {}

    fn register_tensor(_: &WtuneClient, _: (), _: Shape, _: DType) -> RouterTensor<WtuneClient> {
        unreachable!(
            "tensors move to the wtune host only as data, never as another backend's handle"
        )
    }
}

/// The host is the only device: nothing moves between backends.
pub struct NoBridge;

impl MultiBackendBridge for NoBridge {
    type TensorHandle = ();
    type Device = RemoteDevice;

    fn change_backend_float(tensor: (), _: Shape, _: &RemoteDevice) {
        tensor
    }

    fn change_backend_int(tensor: (), _: Shape, _: &RemoteDevice) {
        tensor
    }

    fn change_backend_bool(tensor: (), _: Shape, _: &RemoteDevice) {
        tensor
    }
}
